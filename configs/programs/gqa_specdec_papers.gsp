# Group-query attention (GQA), speculative decoding (32 query tokens).
# Source: Mirage (paper 000) Table 4 / §7.2 and §3: GQA of LLaMA-2-70B, 4096 key/value tokens, modes
# IncDec / SpecDec / PreFill = 1 / 32 / 512 query tokens.
# Shapes chosen: LLaMA-2-70B has 64 query heads and 8 key/value heads of head dim 128 (group size 8). §7.2
# evaluates it under 4-way tensor parallelism ("the 8 key-value heads are equally partitioned across four
# GPUs"; §7.3: "the GQA kernel from LLaMA-2-70B only contains two key-value heads"), so one GPU's program has
# kv = 2 key/value heads and kv*g = 16 query heads. (§3's Fig. 4 example uses head dim 64 and 2000 tokens; it is
# an illustration, so the model's head dim 128 and §7.2's 4096 tokens are used here.)
#
# The papers' form, kept unchanged so that comparisons with Mirage's published search times can still be
# made; gqa_specdec.gsp is the same attention in the stable form (max-subtracting softmax, K as models keep it).
#
# As in Fig. 4a, K and V are replicated (repeat) to match the query heads: query head i reads key/value head
# i // g. O = softmax(Q Kᵀ / sqrt(d)) V, softmax written as exp / sum / div.
# Layout: heads lead: Q [b*kv*g, s, d], V [b*kv, n, d]; K is given PRE-TRANSPOSED as [b*kv, d, n] (as Mirage's
# program takes it).
program gqa_specdec_papers
param b = 1       # sequences in the batch
param kv = 2      # key/value heads on this GPU (8 / 4-way tensor parallelism)
param g = 8       # query heads per key/value head (64 / 8)
param s = 32      # query tokens
param n = 4096    # key/value tokens
param d = 128     # head dim
input Q [b*kv*g, s, d] float16
input K [b*kv, d, n] float16
input V [b*kv, n, d] float16
Kr = repeat(K, dim=0, times=g)        # [b*kv*g, d, n]
Vr = repeat(V, dim=0, times=g)        # [b*kv*g, n, d]
A = scale(matmul(Q, Kr), 1/sqrt(d))   # [b*kv*g, s, n]
E = exp(A)
S = sum(E, dim=2)
P = div(E, S)
O = matmul(P, Vr)                     # [b*kv*g, s, d]
output O
