# RMSNorm followed by a MatMul (Mirage paper 002, §3 case study, Fig. 3):
#   Y = X * G / sqrt(mean(X^2 over h)),  O = Y W
# Shapes from Fig. 3 as described in paper 002's text: the output Z is [b=16, d=4096] and each of the 128 blocks
# (imap x <-> d) receives W as [h=1024, d=32], so X [16, 1024], G [1024], W [1024, 4096].
# No epsilon inside the sqrt, as in Mirage's RMSNorm program (a model with one writes add(x, eps)).
program rmsnorm
param b = 16      # tokens
param h = 1024    # normalised (hidden) dim
param d = 4096    # output features
input X [b, h] float16
input G [h] float16
input W [h, d] float16
S = sum(mul(X, X), dim=1)     # [b, 1]
R = sqrt(scale(S, 1/h))       # root mean square
Y = div(mul(X, G), R)         # [b, h]
O = matmul(Y, W)              # [b, d]
output O
