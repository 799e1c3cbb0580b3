# a SiLU MLP of two matmuls at 8x32 (3 operators)
program silu_mlp
input X [8, 32] float16
input W1 [32, 32] float16
input W2 [32, 32] float16
O = matmul(silu(matmul(X, W1)), W2)
output O
