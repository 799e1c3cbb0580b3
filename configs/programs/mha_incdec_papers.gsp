# Multi-head attention (MHA), incremental decoding (1 query token).
# Source: Mirage (paper 000) Table 4 / §7.2: MHA of LLaMA-7B, 4096 key/value tokens, modes IncDec / SpecDec /
# PreFill = 1 / 32 / 512 query tokens. LLaMA-7B: 32 heads, head dim 128.
#
# The papers' form, kept unchanged so that comparisons with Mirage's published search times can still be
# made; mha_incdec.gsp is the same attention in the stable form (max-subtracting softmax, K as models keep it).
#
# O = softmax(Q Kᵀ / sqrt(d)) V per head, softmax written as exp / sum / div (no max subtraction, as in
# Mirage's attention program, Fig. 4a).
# Layout: heads (of all b sequences) lead: Q [b*h, s, d], V [b*h, n, d]. K is given PRE-TRANSPOSED as
# [b*h, d, n] (as Mirage's program takes it), so the scores are matmul(Q, K).
program mha_incdec_papers
param b = 1       # sequences in the batch
param h = 32      # attention heads
param s = 1      # query tokens
param n = 4096    # key/value tokens
param d = 128     # head dim
input Q [b*h, s, d] float16
input K [b*h, d, n] float16
input V [b*h, n, d] float16
A = scale(matmul(Q, K), 1/sqrt(d))    # [b*h, s, n]
E = exp(A)
S = sum(E, dim=2)                     # [b*h, s, 1]
P = div(E, S)
O = matmul(P, V)                      # [b*h, s, d]
output O
