# LayerNorm without affine (mean, sub, mul, 1/sqrt) then a matmul (10 operators)
program layernorm_matmul
input X [4, 8] float16
input W [8, 6] float16
M = scale(sum(X, dim=1), 1/8)
C = X - M
V = scale(sum(C * C, dim=1), 1/8)
Y = C / sqrt(V + 1e-5)
O = matmul(Y, W)
output O
