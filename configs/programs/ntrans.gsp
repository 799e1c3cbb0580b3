# Normalised-transformer residual update (Mirage paper 002, nTrans benchmark; nGPT):
#   O = norm(X + alpha * (norm(H) - X)),  norm(v) = v / ||v||_2 over the hidden dim
# where X is the hidden state (on the unit sphere), H the output of an attention or MLP sub-block and alpha the
# per-channel "eigen learning rate" vector of nGPT.
# Shapes: paper 002's text here does not reproduce Table 4's sizes; b = 8 tokens and d = 4096 follow the Mirage
# authors' benchmark script (mirage-project/mirage benchmark/norm_transformer.py). That script approximates the
# update with RMSNorm, '+' for '-' and an alpha of shape [8, 4096] (its TODOs say so); here the exact nGPT form
# is written, with alpha a [d] vector as in nGPT.
program ntrans
param b = 8       # tokens
param d = 4096    # hidden size
input H [b, d] float16
input X [b, d] float16
input alpha [d] float16
Hn = div(H, sqrt(sum(mul(H, H), dim=1)))   # norm(H)
U = add(X, mul(alpha, sub(Hn, X)))
O = div(U, sqrt(sum(mul(U, U), dim=1)))    # norm(U)
output O
