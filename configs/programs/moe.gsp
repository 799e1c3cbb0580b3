# Mixture-of-experts expert layer (Mirage paper 000, Table 4 "MoE", Mixtral): every expert is an MLP applied to
# the tokens routed to it; the experts are batched along dim 0:  O[e] = silu(X[e] W1[e]) W2[e].
# Shapes follow the Mirage authors' MoE script (mirage-project/mirage benchmark/moe.py): 8 experts x 8 tokens,
# hidden 4096, expert weights [4096, 4096]. That script uses exp as a stand-in activation (paper 000 §7.2 does
# the same for MLP, since ReLU was not in Mirage's Lax fragment); here Mixtral's activation, SiLU, is used.
# Mixtral's real experts are gated (3 matrices) with f = 14336: use gated_mlp.gsp per expert or --param f=14336.
program moe
param e = 8       # experts
param t = 8       # tokens per expert
param k = 4096    # hidden size
param f = 4096    # expert intermediate size
input X [e, t, k] float16
input W1 [e, k, f] float16
input W2 [e, f, k] float16
O = matmul(silu(matmul(X, W1)), W2)   # batched over experts
output O
