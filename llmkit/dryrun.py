"""What a training run would do, worked out before it starts (`llmkit <stage> --dry-run`):
parameters, batch shape, steps, tokens, memory per device and checkpoint size.

Pure arithmetic on the model's shape and the run's settings — nothing here imports torch or
touches a file — so every figure is unit-tested against a formula, and the memory estimate
against a measured run (tests/cli/test_dry_run.py).

Memory per device is the sum of what a training step holds at its peak:
- weights, gradients and optimizer state: per parameter 4 + 4 + 8 bytes in fp32 (AdamW's two
  moments); 2 + 2 + 12 in bf16/fp16 (DeepSpeed keeps an fp32 master copy beside the moments),
  as in the ZeRO paper. ZeRO stage 1 splits the optimizer state over the processes, stage 2 the
  gradients too, stage 3 the weights too; offloading moves them to CPU memory instead.
- activations: what forward keeps for backward, per token and block 8·hidden + 2·kv_width +
  4·intermediate values (inputs of the norms and projections, q/k/v after RoPE, the attention
  output, SwiGLU's gate, up and product) and n_heads + 2 float32 statistics (attention's
  log-sum-exp per head, the norms' 1/rms), as torch's saved-tensor hooks count them for this
  model. With activation checkpointing only each block's input is kept, and backward recomputes
  one block at a time (after the loss, so the larger of the two counts). A dense attention mask
  (packed or padded batches where attention runs without FlexAttention: on CPU) adds a float
  [batch, 1, seq, seq] mask per block.
- QLoRA (`lora.quant`): the block linears of the frozen base are held as bitsandbytes packs them —
  nf4/fp4 half a byte per weight plus an absmax per block of 64 (a byte with double quantisation,
  plus a float per 256 of those), int8 a byte per weight plus a float per row — counted exactly;
  the dequantised weight each layer builds in forward and backward is transient and not counted.
- `optim=adamw8bit` (bitsandbytes): two 8-bit moments and a float absmax each per block of 256
  (2.03 bytes per parameter instead of 8); tensors under 4,096 elements keep 32-bit moments, a
  share this estimate ignores (adapters of real models are larger).
- the loss: logits are float32 [positions, vocab]. Pretraining computes them 1,024 positions at
  a time (the chunked loss: backward recomputes each chunk), so only one chunk's logits, their
  softmax and gradient exist at once; the other trainers project only the labelled positions,
  counted here as every position of the micro-batch (an upper bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field

GiB = 2**30
MiB = 2**20
LOSS_CHUNK = 1024  # positions per chunk of the pretraining loss (Transformer.loss_chunk_size)
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
QUANT_BLOCK = 64  # weights per absmax of bitsandbytes' 4-bit formats
NESTED_BLOCK = 256  # absmax per float scale under double quantisation
OPTIMIZER_BYTES = {"adamw": 8, "paged_adamw": 8, "adamw8bit": 2 + 8 / 256, "paged_adamw8bit": 2 + 8 / 256}


@dataclass(frozen=True)
class Shape:
    """The fields of `llmkit.model.config.ModelConfig` that size a model."""

    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    tie_embeddings: bool = True
    n_experts: int = 0
    experts_top_k: int = 2
    shared_expert_size: int = 0  # Qwen3.5-MoE's shared expert (llmkit.model.mixture_of_experts)
    head_dim: int | None = None  # None = hidden_size // n_heads
    attention_bias: bool = False
    qk_norm: bool = False
    attention_output_gate: bool = False  # q_proj twice as wide (Qwen3.5)
    layer_types: tuple | None = None  # "linear_attention" layers are Gated DeltaNet mixers
    linear_n_key_heads: int = 16
    linear_n_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel: int = 4

    @classmethod
    def of(cls, config) -> "Shape":
        """From a ModelConfig, or a dict of its fields (a checkpoint's config.json)."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        names = cls.__dataclass_fields__
        fields = {k: get(k) for k in names if get(k) is not None}
        if fields.get("layer_types") is not None:
            fields["layer_types"] = tuple(fields["layer_types"])
        return cls(**fields)

    @property
    def head_width(self) -> int:
        return self.head_dim or self.hidden_size // self.n_heads

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_width


def block_linears(m: Shape, mixer: str = "full_attention") -> dict[str, tuple[int, int, int]]:
    """The linear layers of one block whose token mixer is `mixer` (its `layer_types` entry): name ->
    (in features, out features, how many)."""
    h, i = m.hidden_size, m.intermediate_size
    if mixer == "linear_attention":  # llmkit.model.gated_deltanet.GatedDeltaNet
        keys, values = m.linear_n_key_heads * m.linear_key_head_dim, m.linear_n_value_heads * m.linear_value_head_dim
        heads = m.linear_n_value_heads
        layers = {"in_proj_qkv": (h, 2 * keys + values, 1), "in_proj_z": (h, values, 1), "in_proj_b": (h, heads, 1),
                  "in_proj_a": (h, heads, 1), "out_proj": (values, h, 1)}
    else:
        q = m.n_heads * m.head_width
        layers = {"q_proj": (h, q * (1 + m.attention_output_gate), 1), "k_proj": (h, m.kv_width, 1),
                  "v_proj": (h, m.kv_width, 1), "o_proj": (q, h, 1)}  # q_proj also yields the output gate
    if not m.n_experts:
        return {**layers, "gate_proj": (h, i, 1), "up_proj": (h, i, 1), "down_proj": (i, h, 1)}
    layers.update(gate=(h, m.n_experts, 1), w1=(h, i, m.n_experts), w3=(h, i, m.n_experts), w2=(i, h, m.n_experts))
    if m.shared_expert_size:  # llmkit.model.mixture_of_experts.SharedExpert and its gate
        s = m.shared_expert_size
        layers.update(gate_proj=(h, s, 1), up_proj=(h, s, 1), down_proj=(s, h, 1), shared_expert_gate=(h, 1, 1))
    return layers


def mixers(m: Shape) -> list[str]:
    """Each block's token mixer: `layer_types`, or full attention everywhere."""
    return list(m.layer_types) if m.layer_types else ["full_attention"] * m.n_layers


def parameters(m: Shape) -> int:
    """Parameters of `llmkit.model.transformer.Transformer` of this shape (a tied head counted once)."""
    h = m.hidden_size
    blocks = 0
    for mixer in mixers(m):
        blocks += sum(a * b * n for a, b, n in block_linears(m, mixer).values()) + 2 * h  # + two norms
        if mixer == "linear_attention":  # the convolution, dt_bias, A_log and the gated norm
            conv = 2 * m.linear_n_key_heads * m.linear_key_head_dim + m.linear_n_value_heads * m.linear_value_head_dim
            blocks += conv * m.linear_conv_kernel + 2 * m.linear_n_value_heads + m.linear_value_head_dim
        else:  # q/k/v biases, q/k norms
            blocks += (m.n_heads * m.head_width + 2 * m.kv_width) * m.attention_bias + 2 * m.head_width * m.qk_norm
    embeddings = m.vocab_size * h * (1 if m.tie_embeddings else 2)
    return blocks + embeddings + h  # + the final norm


def lora_parameters(m: Shape, r: int, target) -> int:
    """Parameters of rank-r LoRA adapters (A: r × in, B: out × r) on the targeted linear layers of
    every block (`target`: "all-linear", "attention" or names, as llmkit.checkpoints.lora.LoraConfig has it):
    a hybrid model's Gated DeltaNet blocks counted with their own projections."""
    names = set(targeted(m, target))
    return sum(r * (a + b) * n for mixer in mixers(m) for name, (a, b, n) in block_linears(m, mixer).items()
               if name in names)


def targeted(m: Shape, target) -> list[str]:
    """The block linears `lora.target` names: all-linear, attention (every mixer's projections: q/k/v/o
    and the Gated DeltaNet's, as llmkit.checkpoints.lora.ATTENTION_LAYERS) or names."""
    layers = {name: None for mixer in dict.fromkeys(mixers(m)) for name in block_linears(m, mixer)}
    if target == "all-linear":
        return list(layers)
    if target == "attention":
        mixer_layers = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                        "out_proj")
        return [n for n in mixer_layers if n in layers]
    return [n for n in target if n in layers]


def dora_parameters(m: Shape, target) -> int:
    """DoRA's trained magnitudes: one per output row of every targeted linear layer."""
    names = set(targeted(m, target))
    return sum(b * n for mixer in mixers(m) for name, (_, b, n) in block_linears(m, mixer).items() if name in names)


def quantized_bytes(m: Shape, quant: str, double_quant: bool = True) -> tuple[int, int]:
    """(weights quantised, bytes they take) when the block linears are held in `quant` as
    bitsandbytes stores them: packed weights, absmax per block, codebooks."""
    weights = stored = 0
    for mixer in mixers(m):
        for fan_in, fan_out, count in block_linears(m, mixer).values():
            numel = fan_in * fan_out
            if quant == "int8":
                size = numel + 4 * fan_out  # int8 rows + a float scale per row
            else:
                blocks = -(-numel // QUANT_BLOCK)
                size = -(-numel // 2) + 16 * 4  # two weights a byte + the 16-entry code
                if double_quant:  # uint8 absmax, a float per 256 of them, their 256-entry code and offset
                    size += blocks + 4 * -(-blocks // NESTED_BLOCK) + 256 * 4 + 4
                else:
                    size += 4 * blocks
            weights += numel * count
            stored += size * count
    return weights, stored


def head_parameters(m: Shape) -> int:
    """The output head's own parameters (0 when tied to the embedding)."""
    return 0 if m.tie_embeddings else m.vocab_size * m.hidden_size


@dataclass
class Memory:
    """Bytes per device at the peak of a training step (and what is offloaded to CPU memory)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int  # kept by forward for backward
    loss: int  # logits of the loss at their largest (backward starts there, all activations held)
    recompute: int = 0  # one block's activations, rebuilt in backward (activation checkpointing)
    frozen: int = 0  # models held but not trained (PPO's reference and reward model)
    offloaded: int = 0  # optimizer state / weights in CPU memory instead (ZeRO offload)

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.activations
                + max(self.loss, self.recompute) + self.frozen)


def state_bytes(trainable: int, frozen_params: int, precision: str, zero_stage: int, world_size: int,
                offload_optimizer: bool = False, offload_params: bool = False, optim: str = "adamw",
                quantized: tuple[int, int] = (0, 0)) -> dict:
    """Weights, gradients and optimizer state per device (and offloaded), in bytes; `quantized`
    is (frozen weights held quantised, their bytes: `quantized_bytes`)."""
    mixed = precision != "fp32"
    width = BYTES[precision]
    n = max(world_size, 1)
    weights = trainable * width
    gradients = trainable * width
    optimizer = int(trainable * (OPTIMIZER_BYTES[optim] + (4 if mixed else 0)))  # + fp32 master copy
    if zero_stage >= 1:
        optimizer //= n
    if zero_stage >= 2:
        gradients //= n
    if zero_stage >= 3:
        weights //= n
    offloaded = 0
    if offload_optimizer:
        offloaded, optimizer = offloaded + optimizer, 0
    if offload_params:
        offloaded, weights = offloaded + weights, 0
    held, packed = quantized
    return dict(weights=weights, gradients=gradients, optimizer=optimizer,
                frozen=(frozen_params - held) * width + packed, offloaded=offloaded)


def block_bytes(m: Shape, sequences: int, seq_len: int, precision: str = "fp32",
                dense_mask: bool = False) -> int:
    """What one block keeps for backward: per token 8·hidden + 2·kv_width + 4·intermediate
    values (MoE: for each of the top-k experts) and n_heads + 2 float32 statistics, and a float
    attention mask when it is dense."""
    h, i = m.hidden_size, m.intermediate_size
    mlp = 4 * i * (m.experts_top_k if m.n_experts else 1) + (m.n_experts or 0)
    mask = 4 * sequences * seq_len * seq_len if dense_mask else 0
    stats = m.n_heads + 2  # attention's log-sum-exp per head, each norm's 1/rms (float32)
    return sequences * seq_len * ((8 * h + 2 * m.kv_width + mlp) * BYTES[precision] + 4 * stats) + mask


def activation_bytes(m: Shape, sequences: int, seq_len: int, precision: str = "fp32",
                     checkpointing: bool = False, dense_mask: bool = False) -> int:
    """What forward keeps for backward for `sequences` × `seq_len` tokens, in bytes: every block's
    activations, or with checkpointing each block's input; and outside the blocks the embedding
    output and the final norm's input and output (and the boolean attention rule, when dense)."""
    tokens = sequences * seq_len
    outside = tokens * 3 * m.hidden_size * BYTES[precision]
    rule = sequences * seq_len * seq_len if dense_mask else 0
    if checkpointing:
        return m.n_layers * tokens * m.hidden_size * BYTES[precision] + outside + rule
    return m.n_layers * block_bytes(m, sequences, seq_len, precision, dense_mask) + outside + rule


def loss_bytes(m: Shape, positions: int, chunked: bool) -> int:
    """The logits of the loss at their largest: float32 [positions, vocab] three times (logits,
    their log-softmax, the gradient), for one chunk of LOSS_CHUNK positions when chunked."""
    if chunked:
        positions = min(positions, LOSS_CHUNK)
    return 3 * positions * m.vocab_size * 4


@dataclass
class Plan:
    """What a training run would do: the figures `--dry-run` prints."""

    stage: str
    total_parameters: int
    trainable_parameters: int
    unit: str  # what a step counts: tokens (pretrain), sequences (sft), pairs (rm, dpo), responses (ppo)
    per_step: int  # units per optimizer step, all processes
    tokens_per_step: int  # at most (full sequences)
    max_steps: int
    world_size: int
    memory: Memory
    checkpoint_bytes: int  # one step folder
    keep_last: int
    notes: list[str] = field(default_factory=list)  # facts about the data and the inputs

    @property
    def tokens(self) -> int:
        return self.tokens_per_step * self.max_steps

    def lines(self) -> list[str]:
        mem = self.memory
        unit = "" if self.unit == "tokens" else f" ({self.per_step:,} {self.unit})"
        kept = self.keep_last or "every"
        out = [
            f"{self.stage} --dry-run: nothing is written",
            f"parameters          {self.total_parameters:,} ({self.trainable_parameters:,} trainable)",
            f"per step            {self.tokens_per_step:,} tokens{unit}, on {self.world_size} "
            f"process{'es' if self.world_size > 1 else ''}",
            f"steps               {self.max_steps:,}",
            f"tokens in all       {self.tokens:,}",
            f"memory per device   {human_bytes(mem.total)}",
            f"  weights           {human_bytes(mem.weights)}",
            f"  gradients         {human_bytes(mem.gradients)}",
            f"  optimizer state   {human_bytes(mem.optimizer)}",
            f"  activations       {human_bytes(mem.activations)}",
            f"  loss logits       {human_bytes(mem.loss)}",
        ]
        if mem.recompute:
            out.append(f"  recomputed block  {human_bytes(mem.recompute)} (in backward, after the loss)")
        if mem.frozen:
            out.append(f"  frozen models     {human_bytes(mem.frozen)}")
        if mem.offloaded:
            out.append(f"  in CPU memory     {human_bytes(mem.offloaded)} (offloaded)")
        out.append(f"checkpoint          {human_bytes(self.checkpoint_bytes)} per step folder "
                   f"(keep_last {kept})")
        return out + self.notes


def checkpoint_bytes(saved_parameters: int, trainable: int, precision: str, optim: str = "adamw") -> int:
    """One step folder: model.safetensors, and DeepSpeed's ds/ (the module's weights again and
    the optimizer state: fp32 master copy and moments in mixed precision, moments in fp32)."""
    width = BYTES[precision]
    optimizer = int(trainable * (OPTIMIZER_BYTES[optim] + (4 if precision != "fp32" else 0)))
    return saved_parameters * width + trainable * width + optimizer


def plan(stage: str, shape: Shape, *, trainable: int, total: int, unit: str, per_step: int,
         tokens_per_step: int, sequences: int, seq_len: int, cfg, world_size: int = 1,
         frozen: int = 0, saved: int | None = None, chunked_loss: bool = False,
         loss_positions: int | None = None, dense_mask: bool = False,
         notes: list[str] | None = None) -> Plan:
    """The Plan of a run: `sequences` × `seq_len` is one micro-batch's forward; `cfg` is the
    stage's config (a TrainConfig: precision, ZeRO stage, offload, checkpointing, keep_last, optim,
    lora: DoRA's magnitudes are added to `trainable` here, a quantised base priced here)."""
    notes = list(notes or [])
    quantized = (0, 0)
    if cfg.lora.enabled and cfg.lora.use_dora:
        magnitudes = dora_parameters(shape, cfg.lora.target)
        trainable, total = trainable + magnitudes, total + magnitudes
        saved = None if saved is None else saved + magnitudes
    if cfg.lora.enabled and cfg.lora.quant != "none":
        quantized = quantized_bytes(shape, cfg.lora.quant, cfg.lora.double_quant)
        notes.append(f"frozen base         {quantized[0]:,} block weights in {cfg.lora.quant}: "
                     f"{human_bytes(quantized[1])} instead of {human_bytes(quantized[0] * BYTES[cfg.precision])}")
    state = state_bytes(trainable, frozen, cfg.precision, cfg.zero_stage, world_size,
                        cfg.offload_optimizer, cfg.offload_params, cfg.optim, quantized)
    memory = Memory(
        weights=state["weights"], gradients=state["gradients"], optimizer=state["optimizer"],
        activations=activation_bytes(shape, sequences, seq_len, cfg.precision,
                                     cfg.activation_checkpointing, dense_mask),
        recompute=(block_bytes(shape, sequences, seq_len, cfg.precision, dense_mask)
                   if cfg.activation_checkpointing else 0),
        loss=loss_bytes(shape, loss_positions if loss_positions is not None else sequences * seq_len,
                        chunked_loss),
        frozen=state["frozen"], offloaded=state["offloaded"])
    return Plan(stage, total, trainable, unit, per_step, tokens_per_step, cfg.max_steps, world_size,
                memory, checkpoint_bytes(trainable if saved is None else saved, trainable,
                                         cfg.precision, cfg.optim), cfg.keep_last, notes)


def human_bytes(n: int) -> str:
    if n >= GiB:
        return f"{n / GiB:,.2f} GiB"
    if n >= MiB:
        return f"{n / MiB:,.1f} MiB"
    return f"{n / 1024:,.1f} KiB"
