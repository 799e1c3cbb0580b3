# QKNorm + attention (Mirage paper 002, QKNorm benchmark; query-key normalisation as in Chameleon):
# RMS-normalise every query and key vector over the head dim, then O = softmax(Qn Knᵀ / sqrt(d)) V.
# Shapes: paper 002's text here does not reproduce Table 4's sizes; these follow the Mirage authors' benchmark
# script (mirage-project/mirage benchmark/qknorm_gqa.py): Q [2, 256, 64], K [2, 64, 4096], V [2, 4096, 64].
# That script normalises Q and V (V likely because its K is pre-transposed and its rms_norm only takes the
# last dim); here Q and K are normalised as QKNorm defines, with no gain and no epsilon (as in that script).
# Layout: heads lead; K is given PRE-TRANSPOSED as [b*h, d, n] (gensorage has no transpose op), so K's head
# dim is dim 1.
program qknorm
param b = 1       # sequences in the batch
param h = 2       # heads
param s = 256     # query tokens
param n = 4096    # key/value tokens
param d = 64      # head dim
input Q [b*h, s, d] float16
input K [b*h, d, n] float16
input V [b*h, n, d] float16
Qn = div(Q, sqrt(scale(sum(mul(Q, Q), dim=2), 1/d)))   # normalise each query over d (dim 2)
Kn = div(K, sqrt(scale(sum(mul(K, K), dim=1), 1/d)))   # normalise each key over d (dim 1)
A = scale(matmul(Qn, Kn), 1/sqrt(d))                     # [b*h, s, n]
E = exp(A)
S = sum(E, dim=2)
P = div(E, S)
O = matmul(P, V)                                         # [b*h, s, d]
output O
