"""Architecture families as data: the ModelConfig fields that make a model GPT-2, BERT, T5, ... (sizes aside).

Presets add sizes to these; the Hugging Face converters build configs from them, so a preset and an imported
checkpoint of the same family always agree on every structural field."""

from __future__ import annotations

# Decoders ---------------------------------------------------------------------------------------------------------

# GPT-1 (Radford et al. 2018 §4.1): post-LN blocks, no final norm, GELU, learned positions, tied embeddings. The GELU
# is the tanh approximation: the released finetune-transformer-lm code's `gelu`, and transformers' OpenAIGPT afn.
# Init: N(0, 0.02) for every weight, no rescale (§4.1 "a simple weight initialization of N(0, 0.02)"; the released
# finetune-transformer-lm code; HF OpenAIGPTPreTrainedModel).
GPT1 = dict(
    init_scheme="normal",
    arch="decoder",
    norm="layernorm",
    norm_position="post",
    final_norm=False,
    activation="gelu_tanh",
    position="learned",
    tie_embeddings=True,
)

# GPT-2 (Radford et al. 2019 §2.3): pre-LN with a final LayerNorm, tanh-GELU; residual projections start at
# N(0, 0.02 / sqrt(2 n_layers)) (§2.3; HF GPT2PreTrainedModel). GPT-3 (§2.1) keeps this "modified initialization".
GPT2 = dict(
    init_scheme="gpt2",
    arch="decoder",
    norm="layernorm",
    norm_position="pre",
    final_norm=True,
    activation="gelu_tanh",
    position="learned",
    tie_embeddings=True,
)

# Llama (Touvron et al. 2023 §2.2): pre-RMSNorm, SwiGLU, RoPE, no biases, untied output matrix. Init: N(0, 0.02)
# everywhere, no rescale (HF LlamaPreTrainedModel; the paper publishes none).
LLAMA = dict(
    init_scheme="normal",
    arch="decoder",
    norm="rmsnorm",
    norm_eps=1e-6,
    norm_position="pre",
    final_norm=True,
    activation="swiglu",
    position="rope",
    bias=False,
    tie_embeddings=False,
)

# Fast GPT training (the modded-nanoGPT speedrun's architecture changes): rotary positions, QK-norm, ReLU², RMSNorm,
# no biases, an untied head with soft-capped logits, zero-initialised output projections (trained with Muon).
# The rest of the init is GPT-2's (nanoGPT's N(0, 0.02)): this is GPT-2 with those changes, under lmforge's gpt-fast
# recipe, whose AdamW rate for embeddings and head is tuned to that scale. The speedrun's own script also draws its
# linear layers from PyTorch's default U(±1/sqrt(fan_in)), its embedding from N(0, 1) (behind an RMSNorm this
# stack lacks) and zeroes its LM head.
GPT_FAST = dict(
    init_scheme="gpt2",
    arch="decoder",
    norm="rmsnorm",
    norm_position="pre",
    final_norm=True,
    activation="relu2",
    position="rope",
    qk_norm=True,
    bias=False,
    tie_embeddings=False,
    logit_softcap=30.0,
    zero_init_proj=True,
)

# Transformer-XL (Dai et al. 2019 §3; the released PyTorch code's defaults): post-LN, ReLU FFN, relative attention
# with sinusoidal R, u/v biases and segment-level memory, no biases in the attention projections, embeddings scaled
# by sqrt(d_model), tied output matrix. (The paper's adaptive input/softmax is left out: lmforge's subword
# vocabularies are small enough for a plain softmax.) Init (the released train.py's weights_init, init='normal'):
# N(0, 0.02) for linear layers, embeddings and the u, v biases, LayerNorm gains N(1, 0.02), biases 0.
TRANSFORMER_XL = dict(
    init_scheme="transformer_xl",
    arch="decoder",
    norm="layernorm",
    norm_position="post",
    final_norm=False,
    activation="relu",
    position="xl",
    attn_bias=False,
    scale_embeddings=True,
    tie_embeddings=True,
    dropout=0.1,
    attn_dropout=0.0,
)

# Encoders ---------------------------------------------------------------------------------------------------------

# BERT (Devlin et al. 2019 §3): post-LN, embedding LayerNorm, token + segment + learned positions, exact GELU,
# MLM head = dense + GELU + LayerNorm + tied decoder with its own bias; pooler = dense + tanh over [CLS], and the
# next-sentence classifier over it (BertForPreTraining's heads). Init: N(0, 0.02) for every weight, no rescale, the
# [PAD] embedding row zero (HF BertPreTrainedModel; the released TF code draws truncated normals of the same std).
BERT = dict(
    init_scheme="normal",
    zero_pad_embedding=True,
    arch="encoder",
    norm="layernorm",
    norm_eps=1e-12,
    norm_position="post",
    final_norm=False,
    embedding_norm=True,
    activation="gelu",
    position="learned",
    type_vocab_size=2,
    tie_embeddings=True,
    lm_head_transform=True,
    lm_head_bias=True,
    pooler=True,
    nsp_head=True,
    dropout=0.1,
    attn_dropout=0.1,
)

# RoBERTa (Liu et al. 2019): BERT's layers; positions start at padding_idx + 1 = 2 (fairseq), one segment type,
# no NSP and so no pooler.
ROBERTA = {
    **BERT, "norm_eps": 1e-5, "position_offset": 2, "type_vocab_size": 1, "pooler": False, "nsp_head": False,
    "pad_id": 1,
}  # fmt: skip

# UniLM (Dong et al. 2019 §2): BERT's layers and heads; six segment types, which double as the identifier of the
# LM objective an input is trained with (bidirectional A/B, left-to-right, right-to-left, seq2seq source/target).
UNILM = {**BERT, "type_vocab_size": 6}

# ALBERT (Lan et al. 2020 §3.1): factorised embeddings E -> H and one set of layer weights shared by all layers;
# tanh-GELU; the MLM head maps back to E; the sentence classifier is ALBERT's sentence-order head (§4.1).
ALBERT = {**BERT, "activation": "gelu_tanh", "share_layers": True, "dropout": 0.0, "attn_dropout": 0.0}

# ELECTRA (Clark et al. 2020): BERT layers, embeddings of size E projected to H when E != H. The generator is a
# small MLM (head maps to E, tied); the discriminator has a replaced-token-detection head and no LM head.
ELECTRA_GENERATOR = {**BERT, "pooler": False, "nsp_head": False}
ELECTRA_DISCRIMINATOR = {
    **BERT,
    "pooler": False,
    "nsp_head": False,
    "lm_head": False,
    "lm_head_transform": False,
    "lm_head_bias": False,
    "rtd_head": True,
}

# XLNet (Yang et al. 2019 §2): Transformer-XL layers (post-LN, relative attention, memory) with exact GELU and BERT's
# LayerNorm epsilon, relative segment encodings, and the two-stream attention of permutation language modelling;
# the LM head is the tied embedding matrix plus a bias (Hugging Face's XLNetLMHeadModel). Init: N(0, 0.02) for every
# weight, relative-attention biases, segment encodings and the query-stream vector (the released code's
# initializer; HF XLNetPreTrainedModel).
XLNET = dict(
    init_scheme="normal",
    arch="encoder",
    norm="layernorm",
    norm_eps=1e-12,
    norm_position="post",
    final_norm=False,
    activation="gelu",
    position="xl",
    attn_bias=False,
    rel_segments=True,
    two_stream=True,
    tie_embeddings=True,
    lm_head_bias=True,
    dropout=0.1,
    attn_dropout=0.1,
)

# Encoder-decoders -------------------------------------------------------------------------------------------------

# BART (Lewis et al. 2020 §2.1): post-LN, learned positions offset by 2 (fairseq), LayerNorm over the embeddings of
# both stacks, exact GELU, tied output matrix plus a logits bias; decoding starts from </s> (id 2). Init: N(0, 0.02)
# for every weight, no rescale, the <pad> embedding row zero (HF BartPreTrainedModel).
BART = dict(
    init_scheme="normal",
    zero_pad_embedding=True,
    arch="encoder-decoder",
    norm="layernorm",
    norm_position="post",
    final_norm=False,
    embedding_norm=True,
    activation="gelu",
    position="learned",
    position_offset=2,
    tie_embeddings=True,
    lm_head_bias=True,
    pad_id=1,
    decoder_start_id=2,
    dropout=0.1,
)

# T5 v1.0 (Raffel et al. 2020 §2.1): pre-RMSNorm, no biases, ReLU FFN, bucketed relative position bias per stack,
# no 1/sqrt(d) attention scale (folded into the init), tied output matrix with a d_model**-0.5 rescale.
# Init: Mesh TF's, as HF T5PreTrainedModel does it (ModelConfig.init_scheme 't5'): the embedding N(0, 1), dense layers
# fan-in scaled; init_std is the initializer factor, 1.0.
# Dropout (Mesh TF's transformer layers; HF's T5 modules, one dropout_rate): after the embedding, on the attention
# probabilities, on the feed-forward hidden activation, on each sublayer's output before the residual add, and
# after each stack's final norm.
T5 = dict(
    init_scheme="t5",
    init_std=1.0,
    arch="encoder-decoder",
    norm="rmsnorm",
    norm_eps=1e-6,
    norm_position="pre",
    final_norm=True,
    activation="relu",
    position="t5_bias",
    bias=False,
    scale_attention=False,
    tie_embeddings=True,
    scale_tied_logits=True,
    pad_id=0,
    decoder_start_id=0,
    dropout=0.1,
    attn_dropout=0.1,
    dropout_ffn_hidden=True,
    dropout_final_norm=True,
)

# T5 v1.1: gated-GELU FFN, untied output matrix (so no rescale), no dropout in pre-training (the release notes; the
# sites stay T5's, for a fine-tune that sets a rate).
T5_V1_1 = {
    **T5, "activation": "geglu", "tie_embeddings": False, "scale_tied_logits": False, "dropout": 0.0,
    "attn_dropout": 0.0,
}  # fmt: skip
