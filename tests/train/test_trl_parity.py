"""llmkit's post-training losses against TRL's own code, number for number, offline: the
trainers of the trl installed here (1.16) are built once per module on tiny Llama models
and a tiny byte-level BPE tokenizer made here, and their loss methods are called on batches
llmkit computes its losses on too.

- DPO: per-token log-probs given to TRL's DPOTrainer._compute_loss through a stand-in model,
  and a whole batch of chat pairs, each side tokenised and labelled by its own code, through a
  tiny policy and reference (llmkit's copies hold the same weights): the token ids and label sets,
  the losses and their gradients (w.r.t. the log-probs, and the weights).
- reward model: RewardTrainer.compute_loss and RmTask.loss on the same rewards (margin, centring).
- GRPO: GRPOTrainer._compute_loss (its log-probs and entropies from its own fused LM head, which
  divides by the temperature) on its policy, and PpoTask.loss on llmkit's copy, per micro-batch of
  a step, for each loss_type, with clipping, k3 KL, clip-higher and the entropy bonus: losses and
  weight gradients; the advantages of _generate_and_score_completions.
- SFT: SFTTrainer's assistant-only, padding-free packed batches and compute_loss against llmkit's
  encoding, packing and SftTask.loss, one micro-batch and an accumulated step.

Where TRL 1.16 differs by design (not compared here): its "sigmoid" ignores label_smoothing (older
TRL, and llmkit, make it cDPO; TRL keeps the cDPO formula only inside "aot", compared below on a
batch its sort leaves in order), and it has no reference-free flag (a zero reference is given);
GRPO's use_bias_correction_kl (the k3 term times π/π_old) is on by default in TRL 1.16 and off in
llmkit (`kl_bias_correction`): compared both ways. A DPO completion is, for TRL, every token after
the rendered prompt; for llmkit the reply and its end of turn (what SFT learns): with a ChatML
template that writes a newline after <|im_end|> outside any {% generation %} block, TRL's
completion holds that newline too — one token per sequence more, asserted exactly below.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import transformers
from datasets import Dataset
from trl import (DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, RewardConfig, RewardTrainer, SFTConfig,
                 SFTTrainer)

from llmkit.data.chat import IGNORE_INDEX, collate_sft, encode_sft_rows, packed_row, sft_rows
from llmkit.data.preferences import collate_pairs, encode_pairs
from llmkit.hf.mapping import from_hf_config, from_hf_state_dict
from llmkit.tokenizers.tokenizer_json import HFTokenizer
from llmkit.model.transformer import Transformer
from llmkit.train.actor_critic import ActorCritic
from llmkit.train.dpo import DpoConfig, DpoTask, per_row
from llmkit.train.engine import items_per_micro_batch
from llmkit.train.losses import DPO_LOSS_TYPES, dpo_loss
from llmkit.train.rl_losses import group_relative_advantages
from llmkit.train.ppo import PpoConfig, PpoTask
from llmkit.train.rm import RmTask
from llmkit.train.rollouts import Prompt
from llmkit.train.sft import SftTask
from llmkit.train.task import ITEMS_PER_MICRO_BATCH
from tests.tokenizers.test_tokenizer_json import GENERATION_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe

REL = 1e-5  # the parity asked of every loss and gradient, relative to its largest entry
LLAMA = dict(vocab_size=832, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, intermediate_size=64, max_position_embeddings=256)
PREFERENCES = {"prompt": ["what is the", "hello world", "the model"],
               "chosen": [" answer to it", " again", " trains well on data"],
               "rejected": [" no", " bye bye world", " fails"]}
# the same pairs as chat: llmkit's rows (a user prompt, two replies) and TRL's conversational ones
PAIR_ROWS = [dict(zip(PREFERENCES, values)) for values in zip(*PREFERENCES.values())]
TRL_PAIR_ROWS = [{"prompt": [{"role": "user", "content": r["prompt"]}],
                  "chosen": [{"role": "assistant", "content": r["chosen"]}],
                  "rejected": [{"role": "assistant", "content": r["rejected"]}]} for r in PAIR_ROWS]
# ChatML as Qwen2.5 and SmolLM2 write it: no {% generation %} blocks, a newline after each <|im_end|>
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "hello"},
     {"role": "assistant", "content": "hi there"}, {"role": "user", "content": "again"},
     {"role": "assistant", "content": "hello again, world"}],
    [{"role": "user", "content": "the value of the code?"},
     {"role": "assistant", "content": "return the data to the model"}],
]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rel: float = REL):
    """|actual − expected| ≤ rel · max|expected|, entry by entry."""
    assert actual.shape == expected.shape
    scale = expected.detach().abs().max().clamp(min=1e-12)
    err = ((actual.detach() - expected.detach()).abs().max() / scale).item()
    assert err <= rel, f"relative error {err:.2e} > {rel:.0e}"


def trainer_args(cls, tmp_path_factory, **settings):
    # TRL's configs default to bf16 autocast, even on the CPU: both sides in fp32 instead
    return cls(output_dir=str(tmp_path_factory.mktemp("trl")), report_to="none", use_cpu=True,
               bf16=False, **settings)


def tiny_llama(seed: int, cls=transformers.LlamaForCausalLM, **settings):
    """Weights far from init (std 0.02 would make every distribution nearly uniform and every
    log-ratio nearly 0), norms perturbed so that a norm either side ignored would show."""
    torch.manual_seed(seed)
    model = cls(transformers.LlamaConfig(**LLAMA, **settings))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if p.dim() == 1 else 0.15 * torch.randn_like(p))
    return model


def llmkit_copy(hf_model) -> Transformer:
    """llmkit's Transformer with the weights of a transformers Llama (the import's mapping)."""
    cfg = from_hf_config(hf_model.config.to_dict())
    model = Transformer(cfg)
    model.load_state_dict(from_hf_state_dict(hf_model.state_dict(), cfg))
    return model


def weight_grads(loss, model) -> dict[str, torch.Tensor]:
    named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    return dict(zip([k for k, _ in named], torch.autograd.grad(loss, [p for _, p in named])))


def assert_same_weight_grads(llmkit_loss, llmkit_model, trl_loss, hf_model):
    ours, theirs = weight_grads(llmkit_loss, llmkit_model), weight_grads(trl_loss, hf_model)
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert_close(ours[name], theirs[name])


# ---- fixtures: the tokenizer, and each trainer built once ---------------------------------------

@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    """ChatML with {% generation %} blocks: transformers' assistant mask and llmkit's agree."""
    return save_folder(tmp_path_factory.mktemp("tokenizer"), train_bpe(QWEN_SPECIALS),
                       GENERATION_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>")


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer_folder):
    return transformers.AutoTokenizer.from_pretrained(tokenizer_folder)


@pytest.fixture(scope="module")
def chatml_folder(tmp_path_factory):
    """The same tokenizer with plain ChatML: llmkit finds each reply and its <|im_end|> itself."""
    return save_folder(tmp_path_factory.mktemp("chatml"), train_bpe(QWEN_SPECIALS), CHATML_TEMPLATE,
                       eos_token="<|im_end|>", pad_token="<|endoftext|>")


@pytest.fixture(scope="module")
def dpo(hf_tokenizer, tmp_path_factory):
    """TRL's DPOTrainer with a policy and a different reference on chat pairs, and llmkit copies
    of both."""
    trainer = DPOTrainer(model=tiny_llama(0), ref_model=tiny_llama(1),
                         args=trainer_args(DPOConfig, tmp_path_factory, per_device_train_batch_size=3),
                         train_dataset=Dataset.from_list(TRL_PAIR_ROWS), processing_class=hf_tokenizer)
    return SimpleNamespace(trainer=trainer, policy=llmkit_copy(trainer.model),
                           reference=llmkit_copy(trainer.ref_model).requires_grad_(False))


@pytest.fixture(scope="module")
def reward_trainer(hf_tokenizer, tmp_path_factory):
    """TRL's RewardTrainer; its model is there to build it: the loss is asked of stand-ins."""
    model = tiny_llama(2, transformers.LlamaForSequenceClassification, num_labels=1,
                       pad_token_id=hf_tokenizer.pad_token_id)
    return RewardTrainer(model=model, args=trainer_args(RewardConfig, tmp_path_factory),
                         train_dataset=Dataset.from_dict(PREFERENCES), processing_class=hf_tokenizer)


GROUP, PROMPT_LEN, RESPONSE_LEN, TEMPERATURE, ACCUM = 4, 3, 6, 0.7, 2
MAX_NEW_TOKENS = 8  # the generation budget (dr_grpo's normaliser), above the longest response


def no_reward(completions, **_):
    return [0.0] * len(completions)


@pytest.fixture(scope="module")
def grpo(hf_tokenizer, tmp_path_factory):
    """One optimizer step = ACCUM micro-batches of one group each, one generation per step (TRL's
    default steps_per_generation = gradient_accumulation_steps, as llmkit's rollouts)."""
    # use_bias_correction_kl (TRL 1.16's default: k3 times the ratio π/π_old, DeepSeek-V3.2) is
    # llmkit's kl_bias_correction (off by default); each case sets it
    args = trainer_args(GRPOConfig, tmp_path_factory, per_device_train_batch_size=GROUP,
                        gradient_accumulation_steps=ACCUM, num_generations=GROUP,
                        max_completion_length=MAX_NEW_TOKENS, temperature=TEMPERATURE, beta=0.0,
                        use_bias_correction_kl=False)
    return GRPOTrainer(model=tiny_llama(3), reward_funcs=no_reward, args=args,
                       train_dataset=Dataset.from_dict({"prompt": ["what is the"] * 8}),
                       processing_class=hf_tokenizer)


SEQ_LEN = 256


@pytest.fixture(scope="module")
def sft(hf_tokenizer, tokenizer_folder, tmp_path_factory):
    """TRL's SFTTrainer learning assistant turns only, conversations packed padding-free into
    one row; llmkit's tokenizer on the same folder and a copy of the model."""
    args = trainer_args(SFTConfig, tmp_path_factory, assistant_only_loss=True, packing=True,
                        max_length=SEQ_LEN, per_device_train_batch_size=1)
    trainer = SFTTrainer(model=tiny_llama(4), args=args, processing_class=hf_tokenizer,
                         train_dataset=Dataset.from_dict({"messages": CHATS}))
    return SimpleNamespace(trainer=trainer, model=llmkit_copy(trainer.model),
                           tokenizer=HFTokenizer(tokenizer_folder))


# ---- DPO ----------------------------------------------------------------------------------------

class GivenLogps(torch.nn.Module):
    """Stands in for the model in TRL's DPO forward, whose fused LM head returns per-token
    log-probs [rows, T − 1] (0 where unlabelled): these ones."""

    def __init__(self, per_token):
        super().__init__()
        self.per_token = per_token

    def forward(self, **_):
        zeros = torch.zeros_like(self.per_token.detach())
        return SimpleNamespace(log_probs=self.per_token, entropy=zeros, mean_logits=zeros,
                               is_top1=zeros.bool(), aux_loss=None)


def trl_settings(monkeypatch, trainer, **attributes):
    for name, value in attributes.items():
        monkeypatch.setattr(trainer, name, value)


def preference_logps(pairs: int = 6, width: int = 9, seed: int = 0):
    """(per-token policy log-probs [2B, T−1] with completions of 1..T−2 tokens, completion
    mask [2B, T], reference sequence log-probs [2B]); the pairs ordered so that both the policy's
    and the reference's chosen − rejected log-ratios ascend (so TRL's "aot" sort keeps them)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width - 1, (2 * pairs,), generator=g)
    mask = (torch.arange(width)[None] >= width - lengths[:, None]).long()  # completions end the row
    per_token = -3 * torch.rand(2 * pairs, width - 1, generator=g, dtype=torch.float64) * mask[:, 1:]
    total = per_token.sum(-1)
    order = torch.argsort(total[:pairs] - total[pairs:])
    rows = torch.cat([order, order + pairs])
    ref_rejected = -8 * torch.rand(pairs, generator=g, dtype=torch.float64)
    ref_margin = torch.sort(torch.randn(pairs, generator=g, dtype=torch.float64) * 3).values
    return per_token[rows], mask[rows], torch.cat([ref_rejected + ref_margin, ref_rejected])


# llmkit's loss_type and ε -> TRL's loss_type
DPO_CASES = {
    "sigmoid": (dict(loss_type="sigmoid"), ["sigmoid"]),
    "ipo": (dict(loss_type="ipo", beta=0.5), ["ipo"]),
    "robust": (dict(loss_type="robust", label_smoothing=0.2), ["robust"]),
    # TRL 1.16 writes −(1−ε)·log σ(βh) − ε·log σ(−βh) only in "aot", which sorts the pairs'
    # log-ratios first: on pairs already in that order it is cDPO
    "cdpo": (dict(loss_type="cdpo", label_smoothing=0.2), ["aot"]),
    # TRL 1.16 has no reference-free option: its sigmoid against a reference of log-prob 0
    "reference_free": (dict(loss_type="reference_free"), ["sigmoid"]),
}


def test_the_dpo_cases_cover_every_llmkit_loss_type():
    assert {case["loss_type"] for case, _ in DPO_CASES.values()} == set(DPO_LOSS_TYPES)


@pytest.mark.parametrize("case", list(DPO_CASES))
def test_dpo_loss_and_its_gradient_equal_trls_on_the_same_log_probs(dpo, monkeypatch, case):
    """Per-token log-probs of completions of unequal lengths: llmkit's sequence log-probs
    (`per_row`, averaged for IPO as DpoConfig says) through `dpo_loss`, and TRL's
    _compute_loss, give the same loss and the same gradient w.r.t. every log-prob."""
    settings, trl_loss_type = DPO_CASES[case]
    cfg = DpoConfig(**{"beta": 0.1, **settings})
    per_token, mask, ref = preference_logps()
    if case == "reference_free":
        ref = torch.zeros_like(ref)
    half = len(ref) // 2
    trainer = dpo.trainer
    trl_settings(monkeypatch, trainer, precompute_ref_logps=True, loss_types=trl_loss_type,
                 loss_weights=[1.0], beta=cfg.beta, label_smoothing=cfg.label_smoothing)

    leaf = per_token.clone().requires_grad_()
    inputs = {"input_ids": torch.ones_like(mask), "attention_mask": torch.ones_like(mask),
              "completion_mask": mask, "ref_chosen_logps": ref[:half], "ref_rejected_logps": ref[half:]}
    theirs = trainer.compute_loss(GivenLogps(leaf), inputs)
    their_grad, = torch.autograd.grad(theirs, leaf)

    leaf = per_token.clone().requires_grad_()
    count = mask[:, 1:].sum(-1)
    policy = per_row(leaf.sum(-1), count, cfg.average_logps)
    reference = per_row(ref, count, cfg.average_logps)
    losses, _, _ = dpo_loss(policy[:half], policy[half:], reference[:half], reference[half:],
                            beta=cfg.beta, loss_type=cfg.loss_type, label_smoothing=cfg.label_smoothing)
    ours = losses.mean()
    our_grad, = torch.autograd.grad(ours, leaf)

    assert_close(ours, theirs)
    assert_close(our_grad, their_grad)
    assert their_grad.abs().sum() > 0


# llmkit's DpoConfig -> TRL's loss_type and loss_weights (TRL's RPO is an "sft" term beside the loss)
DPO_MODEL_CASES = {
    "sigmoid": (dict(loss_type="sigmoid"), ["sigmoid"], [1.0]),
    "ipo": (dict(loss_type="ipo", beta=0.5), ["ipo"], [1.0]),
    "robust": (dict(loss_type="robust", label_smoothing=0.1), ["robust"], [1.0]),
    "rpo": (dict(loss_type="sigmoid", rpo_alpha=0.7), ["sigmoid", "sft"], [1.0, 0.7]),
}


@pytest.mark.parametrize("case", list(DPO_MODEL_CASES))
def test_dpo_task_equals_trls_dpo_trainer_on_a_model_batch(dpo, tokenizer_folder, monkeypatch, case):
    """TRL's own tokenised batch of chat pairs through its policy and reference, and llmkit's own
    (encode_pairs, collate_pairs: the same ids and labels) through its copies with DpoTask
    (reference not precomputed): the same loss and weight gradients, so the completion log-probs,
    IPO's averaging and the RPO term (mean NLL of the chosen tokens) agree."""
    settings, trl_loss_type, trl_weights = DPO_MODEL_CASES[case]
    cfg = DpoConfig(**{"beta": 0.1, "precompute_ref": False, **settings})
    trainer = dpo.trainer
    trl_settings(monkeypatch, trainer, loss_types=trl_loss_type, loss_weights=trl_weights,
                 beta=cfg.beta, label_smoothing=cfg.label_smoothing)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    theirs = trainer.compute_loss(trainer.model, batch)

    ours_batch = llmkit_pair_batch(HFTokenizer(tokenizer_folder))
    assert torch.equal(ours_batch["input_ids"], batch["input_ids"])
    assert torch.equal(ours_batch["labels"] != IGNORE_INDEX, batch["completion_mask"].bool())
    task = DpoTask(dpo.policy, None, None, cfg, reference=dpo.reference)
    ours, _ = task.loss(dpo.policy, ours_batch)

    assert_close(ours, theirs)
    assert_same_weight_grads(ours, dpo.policy, theirs, trainer.model)


def llmkit_pair_batch(tokenizer) -> dict:
    """PAIR_ROWS as `llmkit dpo` encodes and collates them: one [2B, T] batch, chosen rows first."""
    pairs, counts = encode_pairs(tokenizer, PAIR_ROWS, SEQ_LEN)
    assert counts["dropped_too_long"] == 0
    return as_torch(collate_pairs(pairs, tokenizer.pad_id))


def trl_pair_batch(trainer, tokenizer) -> dict:
    """The same pairs as TRL's DPOTrainer tokenises (its dataset preparation, with `tokenizer`) and
    collates them."""
    dataset = trainer._prepare_dataset(Dataset.from_list(TRL_PAIR_ROWS), tokenizer, trainer.args, "train")
    return trainer.data_collator([dataset[i] for i in range(len(dataset))])


@pytest.mark.parametrize("template", ["generation blocks", "plain ChatML"])
def test_dpo_labels_llmkit_encodes_are_trls_completion_but_the_newline_after_the_end_of_turn(
        dpo, tokenizer_folder, chatml_folder, template):
    """llmkit's encode_pairs and TRL's DPO tokenisation give the same token ids. Labelled are the
    reply and its <|im_end|> on llmkit's side, everything after the prompt on TRL's: the same set
    where the template's {% generation %} block holds the newline after <|im_end|>; with plain
    ChatML, TRL's set is llmkit's plus exactly that newline, the last token of every sequence."""
    folder = tokenizer_folder if template == "generation blocks" else chatml_folder
    ours = llmkit_pair_batch(HFTokenizer(folder))
    theirs = trl_pair_batch(dpo.trainer, transformers.AutoTokenizer.from_pretrained(folder))
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    our_labels, their_labels = ours["labels"] != IGNORE_INDEX, theirs["completion_mask"].bool()
    assert torch.equal(ours["labels"][our_labels], ours["input_ids"][our_labels])

    last = theirs["attention_mask"].sum(-1) - 1  # each sequence's last token
    rows = torch.arange(len(last))
    tokenizer = HFTokenizer(folder)
    newline, end_of_turn = tokenizer.encode("\n"), tokenizer.end_of_turn_id
    assert len(newline) == 1
    assert (ours["input_ids"][rows, last] == newline[0]).all()
    assert (ours["input_ids"][rows, last - 1] == end_of_turn).all()
    assert our_labels[rows, last - 1].all()  # <|im_end|> is learnt on both sides
    only_trl = their_labels & ~our_labels
    if template == "generation blocks":
        assert torch.equal(our_labels, their_labels)
    else:
        assert not (our_labels & ~their_labels).any()
        assert only_trl.sum(-1).tolist() == [1] * len(last)
        assert only_trl[rows, last].all()


# ---- reward model -------------------------------------------------------------------------------

class GivenRewards(torch.nn.Module):
    """Stands in for a reward model: these rewards, as llmkit's RewardModel returns them ([2B]),
    or as transformers' sequence classifier does (`.logits` [2B, 1]) for TRL."""

    def __init__(self, rewards, hf: bool):
        super().__init__()
        self.rewards, self.hf, self.aux_loss = rewards, hf, torch.zeros(())

    def forward(self, *_, **__):
        return SimpleNamespace(logits=self.rewards[:, None]) if self.hf else self.rewards


@pytest.mark.parametrize("margin, center", [(False, None), (True, None), (True, 0.01), (False, 0.3)])
def test_bradley_terry_loss_and_its_gradient_equal_trls_reward_trainer(reward_trainer, monkeypatch,
                                                                       margin, center):
    """RmTask.loss (chosen rows first, then rejected, as collate_pairs and TRL's collator lay
    them out) and RewardTrainer.compute_loss on the same rewards, with and without a margin and
    TRL's center_rewards_coefficient (llmkit's center_coef)."""
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(10, generator=g) * 2
    margins = torch.rand(5, generator=g) * 2 if margin else torch.zeros(5)  # llmkit's default margin 0
    monkeypatch.setattr(reward_trainer.args, "center_rewards_coefficient", center)
    ids = torch.ones(10, 4, dtype=torch.long)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              **({"margin": margins} if margin else {})}  # TRL's collator adds it only when given

    leaf = rewards.clone().requires_grad_()
    theirs = reward_trainer.compute_loss(GivenRewards(leaf, hf=True), inputs)
    their_grad, = torch.autograd.grad(theirs, leaf)

    leaf = rewards.clone().requires_grad_()
    model = GivenRewards(leaf, hf=False)
    ours, _ = RmTask(model, None, None, center_coef=center or 0.0, seq_len=8).loss(
        model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "margin": margins})
    our_grad, = torch.autograd.grad(ours, leaf)

    assert_close(ours, theirs)
    assert_close(our_grad, their_grad)


# ---- GRPO ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def grpo_policy(grpo):
    """llmkit's copy of the GRPO trainer's policy (TRL has given it its fused, temperature-scaled
    LM head), as PpoTask trains it: an ActorCritic without a value head."""
    return ActorCritic(llmkit_copy(grpo.model), with_value=False)


def grpo_step(actor, seed: int = 0):
    """The micro-batches of one optimizer step: prompts, responses (lengths 1 to R, unequal token
    counts per micro-batch), old log-probs off the policy's own (at the temperature) by enough to
    clip, reference log-probs, and one advantage per response."""
    g = torch.Generator().manual_seed(seed)
    lengths, vocab = [[6, 2, 5, 1], [3, 6, 6, 4]], LLAMA["vocab_size"]
    step = []
    for row_lengths in lengths:
        B = len(row_lengths)
        prompt = torch.randint(0, vocab, (B, PROMPT_LEN), generator=g)
        tokens = torch.randint(0, vocab, (B, RESPONSE_LEN), generator=g)
        mask = (torch.arange(RESPONSE_LEN)[None] < torch.tensor(row_lengths)[:, None]).long()
        attention = torch.cat([torch.ones_like(prompt), mask], 1)
        with torch.no_grad():
            logits, _ = actor(torch.cat([prompt, tokens], 1), attention, PROMPT_LEN)
        logps = torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, tokens[..., None])[..., 0]
        step.append(SimpleNamespace(
            tokens=tokens, mask=mask, prompt=prompt, attention=attention,
            old=logps + 0.4 * torch.randn(B, RESPONSE_LEN, generator=g),
            ref=logps + 0.3 * torch.randn(B, RESPONSE_LEN, generator=g),
            advantages=torch.randn(B, generator=g)))
    return step


GRPO_CASES = {f"{loss_type}, beta={beta}": dict(loss_type=loss_type, beta=beta)
              for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo") for beta in (0.0, 0.04)}
GRPO_CASES["dapo, clip-higher"] = dict(loss_type="dapo", beta=0.04, epsilon_high=0.28)
GRPO_CASES["bnpo, entropy bonus"] = dict(loss_type="bnpo", beta=0.0, entropy_coef=0.05)
GRPO_CASES["dapo, bias-corrected KL"] = dict(loss_type="dapo", beta=0.04, bias_correction=True)
# the variants of train/grpo_losses.py (each against TRL on given log-probs in test_grpo_losses.py)
GRPO_CASES["gspo: grpo, sequence-level ratio"] = dict(loss_type="grpo", beta=0.04, level="sequence")
GRPO_CASES["cispo"] = dict(loss_type="cispo", beta=0.04, epsilon_high=1.3)
GRPO_CASES["sapo"] = dict(loss_type="sapo", beta=0.04)
GRPO_CASES["luspo, sequence-level ratio"] = dict(loss_type="luspo", beta=0.0, level="sequence")
GRPO_CASES["vespo"] = dict(loss_type="vespo", beta=0.04)


@pytest.mark.parametrize("case", list(GRPO_CASES))
def test_grpo_loss_and_its_gradient_equal_trls_per_micro_batch(grpo, grpo_policy, monkeypatch, case):
    """Each micro-batch of a step of two (unequal token counts): PpoTask.loss on llmkit's copy over
    grad_accum — what the engine backpropagates — equals GRPOTrainer.compute_loss on its policy in
    training (which divides by the accumulation steps itself, or for dapo by the step's tokens,
    num_items_in_batch), with the same weight gradients. TRL's log-probs and entropies come from
    its own fused LM head, which divides the logits by the temperature it was built with; llmkit's
    from its logits over cfg.temperature."""
    setting = {"epsilon": 0.2, "epsilon_high": None, "entropy_coef": 0.0, "bias_correction": False,
               "level": "token", **GRPO_CASES[case]}
    epsilon_high = setting["epsilon_high"] or setting["epsilon"]
    trl_settings(monkeypatch, grpo, loss_type=setting["loss_type"], beta=setting["beta"],
                 epsilon_low=setting["epsilon"], epsilon_high=epsilon_high,
                 entropy_coef=setting["entropy_coef"], _entropy_bonus_enabled=setting["entropy_coef"] != 0,
                 importance_sampling_level=setting["level"])
    monkeypatch.setattr(grpo.args, "use_bias_correction_kl", setting["bias_correction"])
    monkeypatch.setattr(grpo, "current_gradient_accumulation_steps", ACCUM, raising=False)
    grpo.model.train()
    cfg = PpoConfig(algo="grpo", loss_type=setting["loss_type"], kl_coef=setting["beta"],
                    clip_range=setting["epsilon"], clip_range_high=setting["epsilon_high"],
                    entropy_coef=setting["entropy_coef"], temperature=TEMPERATURE,
                    kl_bias_correction=setting["bias_correction"], importance_sampling_level=setting["level"],
                    max_new_tokens=MAX_NEW_TOKENS, group_size=GROUP, prompts_per_rollout=ACCUM,
                    micro_batch_size=GROUP, grad_accum=ACCUM)
    task = PpoTask(grpo_policy, None, [Prompt([1])], None, cfg, stop_ids=[], pad_id=0, decode=str)

    step = grpo_step(grpo_policy)
    batches = [{"input_ids": torch.cat([mb.prompt, mb.tokens], 1), "attention_mask": mb.attention,
                "prompt_len": PROMPT_LEN, "response_mask": mb.mask, "logprobs": mb.old,
                "advantages": mb.advantages[:, None] * mb.mask, "ref_logprobs": mb.ref} for mb in step]
    per_micro_batch = items_per_micro_batch(task, batches, "cpu", world_size=1)
    num_items_in_batch = sum(mb.mask.sum() for mb in step)  # TRL's: the generation batch's tokens
    # 14 and 19 tokens: a mean per micro-batch (not over the step) would differ from TRL's for dapo
    assert [int(mb.mask.sum()) for mb in step] == [14, 19]
    clipped = []
    for mb, batch in zip(step, batches):
        inputs = {"prompt_ids": mb.prompt, "prompt_mask": torch.ones_like(mb.prompt),
                  "completion_ids": mb.tokens, "completion_mask": mb.mask, "advantages": mb.advantages,
                  "old_per_token_logps": mb.old, "ref_per_token_logps": mb.ref,
                  "num_items_in_batch": num_items_in_batch}
        theirs = grpo.compute_loss(grpo.model, inputs)

        if per_micro_batch is not None:
            batch[ITEMS_PER_MICRO_BATCH] = per_micro_batch
        ours, metrics = task.loss(grpo_policy, batch)
        ours = ours / cfg.grad_accum

        assert_close(ours, theirs)
        assert_same_weight_grads(ours, grpo_policy.policy, theirs, grpo.model)
        clipped.append(metrics["clipfrac"].item() if "clipfrac" in metrics else 0.5)  # sapo, vespo: no clip
    if setting["level"] == "token":  # (a response's mean log-ratio stays inside the clip here)
        assert all(0 < c < 1 for c in clipped), clipped  # the clip is active on some tokens, not all


SCORES = torch.tensor([0.0, 1.0, 1.0, 0.5,  # a spread group
                       2.0, 2.0, 2.0, 2.0,  # every sample alike: nothing to learn
                       -1.0, 3.0, 0.2, 0.2])


# responses no reward function scored (every reward None): out of their group's mean and std, advantage 0
NAN = float("nan")
SCORES_WITH_NONE = torch.tensor([0.0, NAN, 1.0, 0.5, NAN, NAN, NAN, 2.0, -1.0, 3.0, NAN, 0.2])


@pytest.mark.parametrize("scores", [SCORES, SCORES_WITH_NONE], ids=["scored", "some unscorable"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_relative_advantages_equal_trls(grpo, monkeypatch, scale, scores):
    """GRPOTrainer._generate_and_score_completions, given completions and their rewards (its
    generation and reward functions stood in for), computes the advantages as
    group_relative_advantages does, for each scale_rewards; a group of equal scores gets 0, and
    so does a response no reward scored (NaN)."""
    n = len(scores)
    monkeypatch.setattr(grpo, "scale_rewards", scale)
    monkeypatch.setattr(grpo, "_generate", lambda prompts: (
        [[5, 6]] * n, [[7, 8, 9]] * n, None, ["x"] * n, None, None, None, None))
    monkeypatch.setattr(grpo, "_calculate_rewards", lambda *_: scores[:, None].clone())
    grpo.model.train()
    theirs = grpo._generate_and_score_completions([{"prompt": "p"}] * n)["advantages"]
    ours = group_relative_advantages(scores, GROUP, scale)
    assert_close(ours, theirs)
    assert ours[4:8].abs().max() == 0 and not ours.isnan().any()


# ---- SFT ----------------------------------------------------------------------------------------

def documents(input_ids, labels, position_ids) -> list[tuple[list, list]]:
    """The (ids, labels) of each document of a padding-free row, split where positions restart."""
    starts = (position_ids[0] == 0).nonzero()[:, 0].tolist() + [position_ids.shape[1]]
    return sorted((input_ids[0, a:b].tolist(), labels[0, a:b].tolist()) for a, b in zip(starts, starts[1:]))


def as_torch(batch: dict) -> dict:
    return {k: torch.as_tensor(v) for k, v in batch.items()}


def test_sft_packs_and_masks_as_trl_and_its_loss_and_gradient_equal_trls(sft):
    """TRL's dataset pipeline (chat template, assistant masks, BFD packing, padding-free collator)
    and llmkit's (encode_sft_rows, sft_rows, collate_sft) put the same documents in one packed row
    with the same labels — assistant replies and their end of turn, no document start —; TRL's
    compute_loss and SftTask.loss on the two copies of the model give the same loss and weight
    gradients (the mean NLL over labelled tokens, attention blocked between documents)."""
    trainer = sft.trainer
    assert len(trainer.train_dataset) == 1  # every conversation in one packed row
    theirs_batch = trainer.data_collator([trainer.train_dataset[0]])
    examples, _ = encode_sft_rows(sft.tokenizer, [{"messages": m} for m in CHATS], SEQ_LEN)
    ours_batch = as_torch(collate_sft(sft_rows(examples, SEQ_LEN, packing=True), sft.tokenizer.pad_id))
    assert len(ours_batch["input_ids"]) == 1
    assert documents(ours_batch["input_ids"], ours_batch["labels"], ours_batch["position_ids"]) == \
        documents(theirs_batch["input_ids"], theirs_batch["labels"], theirs_batch["position_ids"])

    theirs = trainer.compute_loss(trainer.model, theirs_batch)
    task = SftTask(sft.model, None, None, seq_len=SEQ_LEN, pad_id=sft.tokenizer.pad_id)
    ours, _ = task.loss(sft.model, ours_batch)
    assert_close(ours, theirs)
    assert_same_weight_grads(ours, sft.model, theirs, trainer.model)


def test_an_accumulated_sft_step_weighs_every_labelled_token_alike_as_trls(sft):
    """Two padding-free micro-batches of unequal labelled tokens (two conversations, then one):
    each micro-batch's SftTask.loss over grad_accum equals TRL's compute_loss given the step's
    num_items_in_batch as transformers' Trainer counts it, and their gradients agree."""
    trainer = sft.trainer
    examples, _ = encode_sft_rows(sft.tokenizer, [{"messages": m} for m in CHATS], SEQ_LEN)
    groups = [examples[:2], examples[2:]]
    theirs_batches = [trainer.data_collator([dataclasses.asdict(ex) for ex in group]) for group in groups]
    ours_batches = [as_torch(collate_sft([packed_row(group)], sft.tokenizer.pad_id)) for group in groups]
    for t, o in zip(theirs_batches, ours_batches):  # TRL's padding-free rows are llmkit's packed rows
        for key in ("input_ids", "labels", "position_ids"):
            assert torch.equal(t[key], o[key]), key
    task = SftTask(sft.model, None, None, seq_len=SEQ_LEN, pad_id=sft.tokenizer.pad_id)
    counts = [task.items_in_batch(b) for b in ours_batches]
    assert counts[0] != counts[1]
    num_items_in_batch = trainer._get_num_items_in_batch(theirs_batches, torch.device("cpu"))
    assert int(num_items_in_batch) == sum(counts)
    per_micro_batch = items_per_micro_batch(task, ours_batches, "cpu", world_size=1)
    for t, o in zip(theirs_batches, ours_batches):
        theirs = trainer.compute_loss(trainer.model, t, num_items_in_batch=num_items_in_batch)
        ours, _ = task.loss(sft.model, {**o, ITEMS_PER_MICRO_BATCH: per_micro_batch})
        ours = ours / len(ours_batches)  # the engine's division by grad_accum
        assert_close(ours, theirs)
        assert_same_weight_grads(ours, sft.model, theirs, trainer.model)
