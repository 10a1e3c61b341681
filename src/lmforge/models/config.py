"""The one model config: every architectural variant of the three families is a typed field here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmforge.config.types import NonNegInt, OpenFraction, PosFloat, check_ranges
from lmforge.models.position_schemes import POSITION_SCHEMES, PositionScheme

Arch = Literal["decoder", "encoder", "encoder-decoder"]
Norm = Literal["layernorm", "rmsnorm"]
Activation = Literal["gelu", "gelu_tanh", "relu", "relu2", "silu", "swiglu", "geglu"]
Position = Literal["learned", "sinusoidal", "rope", "alibi", "t5_bias", "shaw", "xl", "none"]
MaskKind = Literal["causal", "bidirectional", "prefix"]
AttnPattern = Literal["dense", "banded", "strided", "fixed"]
InitScheme = Literal["gpt2", "normal", "t5", "transformer_xl", "t2t"]


@dataclass
class ModelConfig:
    """Architecture of a transformer language model (decoder, encoder or encoder-decoder)."""

    name: str = "custom"
    """Preset name this config came from (informational)."""
    arch: Arch = "decoder"
    """decoder: one causal (or prefix-LM) stack; encoder: one bidirectional stack; encoder-decoder: two stacks."""
    vocab_size: int = 50257
    d_model: int = 768
    n_layers: int = 12
    """Layers of the (encoder) stack."""
    n_decoder_layers: int | None = None
    """Decoder layers of an encoder-decoder (None = n_layers)."""
    n_heads: int = 12
    n_kv_heads: int | None = None
    """Key/value heads for grouped-query attention (None = n_heads, i.e. multi-head attention)."""
    head_dim: int | None = None
    """Per-head width (None = d_model // n_heads; T5 sets it independently)."""
    d_ff: int = 3072
    max_seq_len: int = 1024
    norm: Norm = "layernorm"
    norm_eps: PosFloat = 1e-5
    norm_position: Literal["pre", "post"] = "pre"
    """pre-LN (GPT-2, T5, Llama) normalises sublayer inputs; post-LN (GPT-1, BERT, BART) normalises residual sums."""
    final_norm: bool = True
    """Norm after the last block (pre-LN stacks need one)."""
    embedding_norm: bool = False
    """Norm over the summed embeddings (BERT, BART)."""
    activation: Activation = "gelu_tanh"
    """relu2: ReLU squared (So et al. 2021, Primer), the MLP of fast GPT training recipes."""
    qk_norm: bool = False
    """RMS-normalise queries and keys per head before attention (and before rotary positions), with a learned
    scale (Dehghani et al. 2023): stable attention logits at high learning rates."""
    logit_softcap: float | None = None
    """Cap LM-head logits smoothly at ±c: c·tanh(z / c) (Gemma 2; fast GPT training recipes use 30)."""
    zero_init_proj: bool = False
    """Initialise the attention output and MLP down projections at zero: every block starts as the identity."""
    position: Position = "learned"
    position_offset: int = 0
    """Index shift of learned positions (BART's learned positions start at row 2)."""
    rope_base: PosFloat = 10000.0
    rel_buckets: int = 32
    """T5 relative-attention buckets."""
    rel_max_distance: int = 128
    """T5 bucket max distance, and Shaw et al.'s clipping distance for position='shaw'."""
    shaw_values: bool = True
    """position='shaw': also add relative vectors to the values (Shaw et al. 2018 eq. 3, a^V_ij, clipped like the
    key ones). Configs saved before this field existed read as false (key-only: what they were trained with)."""
    bias: bool = True
    """Biases in attention and MLP projections (False for T5 and Llama)."""
    attn_bias: bool | None = None
    """Biases in the attention projections alone (None = `bias`); Transformer-XL and XLNet have none there but keep
    the MLP's."""
    mem_len: int = 0
    """Transformer-XL segment recurrence (Dai et al. 2019 §3.2; position='xl'): hidden states of the previous
    segments kept per layer as extra, stop-gradient keys and values (0 = no memory)."""
    clamp_len: int = 0
    """position='xl': relative distances beyond clamp_len share R_clamp_len (0 = no clamping)."""
    rel_segments: bool = False
    """XLNet §2.5 relative segment encoding (position='xl'): a learned bias and one of two segment vectors, for
    "same segment" and "different segment", score each query-key pair from token_type_ids."""
    two_stream: bool = False
    """XLNet §2.3 two-stream attention (position='xl'): a query stream, started from a learned vector, that knows
    the target position but not its content runs beside the content stream (models/recurrence.py)."""
    tie_embeddings: bool = True
    """LM head shares the token embedding matrix."""
    mask: MaskKind = "causal"
    """Self-attention mask of a decoder-only stack: causal, or prefix-LM (fully visible prefix, causal rest)."""
    attn_pattern: AttnPattern = "dense"
    """Self-attention of the sparse layers of a causal decoder (models/sparse.py): dense = no sparse layers;
    banded = GPT-3 §2.1's locally banded layers (a query sees itself and the attn_band - 1 tokens before it);
    strided / fixed = Child et al. 2019 §4.2's factorised patterns (stride attn_stride, summary width
    attn_fixed_c)."""
    attn_band: int = 256
    """Keys a query of a banded layer sees, itself included (GPT-3 does not publish its band; GPT-Neo uses 256)."""
    attn_stride: int = 128
    """Child et al.'s stride l of the strided and fixed patterns (128 for their text models)."""
    attn_fixed_c: int = 32
    """Child et al.'s c of the fixed pattern: the last c positions of each stride-l block summarise it (32)."""
    attn_sparse_every: int = 2
    """Layer i is sparse when i % attn_sparse_every == attn_sparse_every - 1: 2 alternates dense and sparse layers
    from a dense first layer (GPT-3 §2.1), 1 makes every layer sparse (Child et al.)."""
    attn_factorize: Literal["union", "interleaved", "heads"] = "union"
    """How a strided / fixed layer uses Child et al.'s two index sets A(1), A(2) (§4.3): union = every head attends
    to A(1) ∪ A(2) (merged head); interleaved = the k-th sparse layer uses A(1 + k mod 2); heads = the first
    half of the heads attend to A(1), the rest to A(2)."""
    type_vocab_size: NonNegInt = 0
    """Segment (token type) embeddings, BERT's sentence A/B (0 = none)."""
    embedding_dim: int | None = None
    """ALBERT's factorised embedding size E (None = d_model); an E→d_model projection follows the embeddings."""
    share_layers: bool = False
    """ALBERT cross-layer parameter sharing: one block's weights reused n_layers times."""
    share_encoder_decoder: bool = False
    """T5 'Enc-dec, shared': the decoder reuses the encoder's self-attention and MLP weights."""
    scale_embeddings: bool = False
    """Multiply token embeddings by sqrt(d_model) (Vaswani et al. §3.4)."""
    scale_attention: bool = True
    """Scale logits by 1/sqrt(head_dim); T5 folds that into its initialisation instead."""
    lm_head: bool = True
    lm_head_transform: bool = False
    """BERT/RoBERTa/ELECTRA MLM head: dense + activation + norm before the vocabulary projection."""
    lm_head_bias: bool = False
    scale_tied_logits: bool = False
    """Rescale hidden states by d_model**-0.5 before the LM head: T5 v1.0 does, as its head is the tied
    embedding matrix (initialised with std 1)."""
    pooler: bool = False
    """BERT pooler: dense + tanh over the first token."""
    rtd_head: bool = False
    """ELECTRA discriminator head: dense + activation + one replaced-token logit per position."""
    nsp_head: bool = False
    """BERT next-sentence (ALBERT sentence-order) classifier: two logits from the pooled first token."""
    mtp_heads: int = 0
    """Multi-token prediction (decoders): extra heads predicting tokens t+2 .. t+1+mtp_heads (models/mtp.py);
    they only run when training asks for them, so inference uses the next-token head alone."""
    mtp_sequential: bool = False
    """DeepSeek-V3 §2.2 sequential MTP modules (depth k sees depth k-1 and the embedding of token t+k) instead of
    Gloeckle et al.'s independent heads on the shared trunk."""
    mtp_head: Literal["block", "linear"] = "block"
    """A parallel MTP head: one transformer block or one linear layer (sequential depths are always blocks)."""
    pad_id: NonNegInt = 0
    """Padding token id (exported as the Hugging Face pad_token_id; collators pad with it)."""
    decoder_start_id: NonNegInt = 0
    """First decoder input of an encoder-decoder (T5: pad, BART: </s>)."""
    dropout: OpenFraction = 0.0
    """Dropout on the embeddings and on each sublayer's output before its residual add (and the sites below)."""
    attn_dropout: OpenFraction = 0.0
    """Dropout on the attention probabilities (SDPA's dropout_p)."""
    dropout_ffn_hidden: bool = False
    """Also apply `dropout` to the MLP's hidden activation, before the down projection (T5's DenseReluDense)."""
    dropout_final_norm: bool = False
    """Also apply `dropout` to each stack's output, after its final norm (T5Stack)."""
    init_scheme: InitScheme = "gpt2"
    """How parameters start (models/init.py), as the family's reference starts them:
    gpt2 = N(0, init_std) for every matrix and embedding, the residual output projections (attention out, MLP down)
    N(0, init_std / sqrt(2 n_layers)) (GPT-2 §2.3; HF GPT2PreTrainedModel; also configs saved before this field);
    normal = N(0, init_std) for every matrix and embedding, no rescale (HF PreTrainedModel._init_weights of BERT,
    RoBERTa, ALBERT, ELECTRA, BART, Llama, XLNet; GPT-1's released code);
    t5 = Mesh TF's fan-in init as HF T5PreTrainedModel._init_weights does it (Mesh TF layers.py, attention.py), with
    init_std as HF's initializer_factor f (1.0): embeddings N(0, f), dense layers N(0, f / sqrt(fan_in)) (the query
    also x d_kv^-0.5, standing in for the 1/sqrt(d_kv) attention scale), relative-position tables
    N(0, f / sqrt(d_model)), an untied LM head N(0, f), norm gains f;
    transformer_xl = N(0, init_std) for matrices, embeddings and the u, v biases, LayerNorm gains N(1, init_std)
    (Dai et al.'s released PyTorch code, train.py weights_init);
    t2t = tensor2tensor's transformer_base (Vaswani et al.'s code; optimize.get_variable_initializer
    "uniform_unit_scaling"): dense layers Glorot-uniform (q, k and v each on its own), gain init_std (1.0 there),
    the token embedding and an untied softmax matrix N(0, d_model^-0.5), other tables (Shaw's) Glorot-uniform."""
    zero_pad_embedding: bool = False
    """Token-embedding row pad_id starts at zero, as an embedding with a padding_idx does in the references (HF BERT,
    RoBERTa, ALBERT, ELECTRA, BART; fairseq)."""
    init_std: PosFloat = 0.02
    """The std of the normal init (init_scheme gpt2, normal, transformer_xl); under t5 the factor every fan-in std
    is multiplied by (HF T5's initializer_factor, 1.0 in the reference); under t2t the Glorot gain (1.0)."""

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers

    @property
    def qkv_bias(self) -> bool:
        """Whether the attention projections have biases."""
        return self.bias if self.attn_bias is None else self.attn_bias

    @property
    def gated(self) -> bool:
        return self.activation in ("swiglu", "geglu")

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> ModelConfig:
        """This config: an lmforge model is text-only, so its text config is itself. `transformers.Trainer` asks for
        it when it aligns the model with a `transformers` tokenizer given as processing_class (the arguments are
        those of `PretrainedConfig.get_text_config`, which picks a sub-config of a multimodal model)."""
        return self

    # --- architecture facts: code outside models/ asks these instead of comparing `arch` to a string ---------

    @property
    def is_decoder(self) -> bool:
        """Decoder-only: one causal (or prefix-LM) stack, `model.decoder`."""
        return self.arch == "decoder"

    @property
    def is_encoder(self) -> bool:
        """Encoder-only: one bidirectional stack, `model.encoder`."""
        return self.arch == "encoder"

    @property
    def is_encoder_decoder(self) -> bool:
        """Two stacks: a bidirectional encoder and a causal decoder with cross-attention."""
        return self.arch == "encoder-decoder"

    @property
    def has_encoder(self) -> bool:
        """There is a bidirectional encoder stack (encoder-only or encoder-decoder)."""
        return not self.is_decoder

    @property
    def has_decoder(self) -> bool:
        """There is a causal decoder stack (decoder-only or encoder-decoder): with an LM head, the model generates."""
        return not self.is_encoder

    @property
    def input_stack(self) -> str:
        """The `Transformer` attribute of the stack that reads `input_ids`: "decoder" for decoder-only models,
        "encoder" otherwise."""
        return "decoder" if self.is_decoder else "encoder"

    # --- position facts: from the scheme's row in `POSITION_SCHEMES`, never a string compared outside models/ ---

    @property
    def position_scheme(self) -> PositionScheme:
        """The facts of `position` (models/position_schemes.py)."""
        return POSITION_SCHEMES[self.position]

    @property
    def max_positions(self) -> int | None:
        """How many positions the model can encode: max_seq_len for learned positions, None when unbounded."""
        return self.position_scheme.max_positions(self.max_seq_len)

    def check_length(self, n: int, message: str = "sequence of length {n} exceeds max_seq_len {limit}") -> None:
        """LMForgeError(message formatted with n and the limit) when n positions exceed `max_positions`.

        n is a Python int: checking tensor values would sync with the device."""
        limit = self.max_positions
        if limit is not None and n > limit:
            from lmforge.errors import LMForgeError

            raise LMForgeError(message.format(n=n, limit=limit))

    def validate(self) -> None:
        """Raise LMForgeError for inconsistent fields."""
        from lmforge.errors import LMForgeError

        check_ranges(self, "model.")  # what the config loader checks, also for configs built in Python
        for name in ("pad_id", "decoder_start_id"):
            if getattr(self, name) >= self.vocab_size:
                raise LMForgeError(
                    f"model.{name}={getattr(self, name)} is not a token of model.vocab_size={self.vocab_size}"
                )
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise LMForgeError(f"model.{name} must be positive, got {getattr(self, name)}")
        for name in ("n_decoder_layers", "n_kv_heads", "head_dim", "embedding_dim"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise LMForgeError(f"model.{name} must be positive or null, got {value}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise LMForgeError(f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise LMForgeError(f"model.n_heads={self.n_heads} is not a multiple of model.n_kv_heads={self.kv_heads}")
        if self.position == "rope" and self.dim_head % 2:
            raise LMForgeError("rope needs an even head dimension")
        if self.mask != "causal" and self.arch != "decoder":
            raise LMForgeError(f"model.mask='{self.mask}' applies to decoder-only models, not arch '{self.arch}'")
        if self.share_encoder_decoder:
            if self.arch != "encoder-decoder":
                raise LMForgeError("model.share_encoder_decoder needs arch 'encoder-decoder'")
            if self.decoder_layers != self.n_layers:
                raise LMForgeError(
                    f"model.share_encoder_decoder needs as many decoder layers as encoder layers "
                    f"({self.decoder_layers} != {self.n_layers})"
                )
        if self.position == "t5_bias" and (self.rel_buckets < 4 or self.rel_max_distance <= self.rel_buckets // 2):
            raise LMForgeError(
                f"model.rel_buckets={self.rel_buckets} and model.rel_max_distance={self.rel_max_distance}: "
                "T5 buckets need rel_buckets >= 4 and rel_max_distance > rel_buckets // 2"
            )
        if self.nsp_head and not self.pooler:
            raise LMForgeError("model.nsp_head classifies the pooled first token: it needs model.pooler=true")
        if self.logit_softcap is not None and self.logit_softcap <= 0:
            raise LMForgeError(f"model.logit_softcap must be positive or null, got {self.logit_softcap}")
        if self.position_offset < 0:
            raise LMForgeError(f"model.position_offset must be >= 0, got {self.position_offset}")
        self._validate_mtp()
        self._validate_xl()
        self._validate_sparse()

    def _validate_xl(self) -> None:
        from lmforge.errors import LMForgeError

        for name in ("mem_len", "clamp_len"):
            if getattr(self, name) < 0:
                raise LMForgeError(f"model.{name} must be >= 0, got {getattr(self, name)}")
        if self.position != "xl":
            for name in ("mem_len", "clamp_len", "rel_segments", "two_stream"):
                if getattr(self, name):
                    raise LMForgeError(f"model.{name} needs model.position='xl' (Transformer-XL relative attention)")
            return
        if self.arch == "encoder-decoder" or self.mask == "prefix":
            raise LMForgeError("model.position='xl' applies to causal decoders and encoders, not encoder-decoders")
        if self.kv_heads != self.n_heads:
            raise LMForgeError("model.position='xl' needs multi-head attention (model.n_kv_heads null or n_heads)")
        if self.mtp_heads:
            raise LMForgeError("model.position='xl' does not combine with model.mtp_heads")

    def _validate_sparse(self) -> None:
        from lmforge.errors import LMForgeError

        for name in ("attn_band", "attn_stride", "attn_fixed_c", "attn_sparse_every"):
            if getattr(self, name) <= 0:
                raise LMForgeError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.attn_pattern == "dense":
            return
        if self.arch != "decoder" or self.mask != "causal":
            raise LMForgeError(
                f"model.attn_pattern='{self.attn_pattern}' needs a causal decoder (arch 'decoder', mask 'causal')"
            )
        if self.attn_pattern == "fixed" and self.attn_fixed_c > self.attn_stride:
            raise LMForgeError(
                f"model.attn_fixed_c={self.attn_fixed_c} must be at most model.attn_stride={self.attn_stride}"
            )
        if self.attn_factorize == "heads" and self.attn_pattern != "banded" and self.n_heads < 2:
            raise LMForgeError("model.attn_factorize='heads' splits the heads between two patterns: n_heads >= 2")

    def _validate_mtp(self) -> None:
        from lmforge.errors import LMForgeError

        if self.mtp_heads < 0:
            raise LMForgeError(f"model.mtp_heads must be >= 0, got {self.mtp_heads}")
        if self.mtp_heads and (self.arch != "decoder" or self.mask != "causal" or not self.lm_head):
            raise LMForgeError("model.mtp_heads needs a causal decoder with an LM head (arch 'decoder', mask 'causal')")
        if self.mtp_heads and (self.embedding_dim or self.d_model) != self.d_model:
            raise LMForgeError("model.mtp_heads needs model.embedding_dim equal to model.d_model (or null)")
