# Multi-layer perceptron (Mirage paper 000, Table 4 "MLP", the adapter-tuning MLP; §7.2: it uses ReLU):
#   O = relu(X W1) W2
# Shapes: the paper gives none. These are our choice, matching the expert MLP of the Mirage authors' MoE script
# (mirage-project/mirage benchmark/moe.py: [8, 4096] activations, [4096, 4096] weights) with a single expert.
program mlp
param t = 8       # tokens
param k = 4096    # input/output features
param f = 4096    # hidden features
input X [t, k] float16
input W1 [k, f] float16
input W2 [f, k] float16
O = matmul(relu(matmul(X, W1)), W2)
output O
