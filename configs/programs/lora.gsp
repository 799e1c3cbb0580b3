# Low-rank adaptation (LoRA): O = W X + B A X (Mirage paper 000, Fig. 9 and §7.3; Table 4: LLaMA-7B-LoRA).
# Written row-major (tokens as rows), i.e. the transpose of the paper's column form: O = X W + (X A) B, which
# Mirage fuses as (X || X A) (W || B) (paper 000 §7.3).
# Shapes chosen: d_in = d_out = 4096 is LLaMA-7B's hidden size; rank r = 16 and t = 16 tokens follow the Mirage
# authors' LoRA benchmark script (mirage-project/mirage benchmark/lora.py: X [16, .], A [., 16], B [16, 4096]).
# The papers' text gives no further sizes.
program lora
param t = 16      # tokens
param k = 4096    # input features
param m = 4096    # output features
param r = 16      # LoRA rank
input X [t, k] float16
input W [k, m] float16
input A [k, r] float16
input B [r, m] float16
C = matmul(X, W)              # base linear layer
E = matmul(matmul(X, A), B)   # low-rank adapter
O = add(C, E)
output O
