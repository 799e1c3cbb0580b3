# Gated MLP: O = silu(X W1) * (X W2) (Mirage paper 002, GatedMLP benchmark, Fig. 10 and Table 4).
# Shapes: the text of paper 002 available here does not reproduce Table 4's sizes; these follow the Mirage
# authors' benchmark script (mirage-project/mirage benchmark/gated_mlp.py): X [8, 4096], W1 = W2 [4096, 4096].
program gated_mlp
param t = 8       # tokens
param k = 4096    # hidden size
param f = 4096    # intermediate size
input X [t, k] float16
input W1 [k, f] float16
input W2 [k, f] float16
G = silu(matmul(X, W1))
U = matmul(X, W2)
O = mul(G, U)
output O
