# Multi-head attention (MHA), speculative decoding (32 query tokens).
# Source: Mirage (paper 000) Table 4 / §7.2: MHA of LLaMA-7B, 4096 key/value tokens, modes IncDec / SpecDec /
# PreFill = 1 / 32 / 512 query tokens. LLaMA-7B: 32 heads, head dim 128.
#
# O = softmax(Q Kᵀ / sqrt(d)) V per head with the stable softmax (the row maximum subtracted before exp, as
# torch's F.softmax and F.scaled_dot_product_attention compute it), and K as models keep it, [heads, keys,
# dim], transposed in the program. Mirage's attention (Fig. 4a) has exp / sum / div without the maximum and
# K given pre-transposed: that form overflows on the large logits of real models (attention sinks), and
# stays available unchanged as mha_specdec_papers.gsp for comparisons with Mirage's published search times.
# Layout: heads (of all b sequences) lead: Q [b*h, s, d], K and V [b*h, n, d].
program mha_specdec
param b = 1       # sequences in the batch
param h = 32      # attention heads
param s = 32      # query tokens
param n = 4096    # key/value tokens
param d = 128     # head dim
input Q [b*h, s, d] float16
input K [b*h, n, d] float16
input V [b*h, n, d] float16
A = scale(matmul(Q, transpose(K, 1, 2)), 1/sqrt(d))   # [b*h, s, n]
P = softmax(A, dim=2)                                 # exp(A - max A) / sum exp(A - max A)
O = matmul(P, V)                                      # [b*h, s, d]
output O
