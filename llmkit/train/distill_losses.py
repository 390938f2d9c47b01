"""The losses of knowledge distillation (`llmkit distill`), pure functions of logits.

`generalized_jsd` is GKD's generalised Jensen–Shannon divergence (Agarwal et al. 2024, Eq. 1) as
TRL's `GKDTrainer.generalized_jsd_loss` computes it, per position: both distributions are
softened by the temperature (no T² factor, as TRL's), the mixture is (1 − β)·student + β·teacher,
and β = 0 / 1 are the forward KL(teacher ‖ student) / reverse KL(student ‖ teacher) themselves.
`restricted_to_top_k` is what a top-k teacher sees: both distributions over the teacher's k
likeliest tokens plus one bucket holding the rest of the vocabulary, so a teacher stored as its
top-k logits (and its rest's mass) gives the loss its whole logits would give on those k + 1
outcomes. The bucket is what keeps the student's mass off the tokens the teacher does not rank:
renormalised over the k tokens alone, the student was never pushed down elsewhere, and a demo
student distilled that way answered with tokens the teacher never ranks ("c j佁").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# loss name -> the β of `generalized_jsd` it is (None: the configured β)
DISTILL_LOSSES = {"forward_kl": 0.0, "reverse_kl": 1.0, "jsd": None}


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float,
                    temperature: float = 1.0) -> torch.Tensor:
    """The divergence at each position, summed over the vocabulary: [..., V] -> [...]."""
    student = F.log_softmax(student_logits / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits / temperature, dim=-1)
    # F.kl_div(input, target) is KL(target ‖ input): the order is the paper's swapped
    if beta == 0:
        return F.kl_div(student, teacher, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return F.kl_div(teacher, student, reduction="none", log_target=True).sum(-1)
    b = torch.tensor(beta, dtype=student.dtype, device=student.device)
    mixture = torch.logsumexp(torch.stack([student + torch.log1p(-b), teacher + torch.log(b)]), dim=0)
    to_teacher = F.kl_div(mixture, teacher, reduction="none", log_target=True)
    to_student = F.kl_div(mixture, student, reduction="none", log_target=True)
    return (b * to_teacher + (1 - b) * to_student).sum(-1)


def distill_divergence(student_logits, teacher_logits, loss_type: str, beta: float,
                       temperature: float) -> torch.Tensor:
    """`generalized_jsd` of a loss named in DISTILL_LOSSES (jsd at `beta`)."""
    fixed = DISTILL_LOSSES[loss_type]
    return generalized_jsd(student_logits, teacher_logits, beta if fixed is None else fixed,
                           temperature)


def teacher_top_k(teacher_logits: torch.Tensor, k: int,
                  temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(the k largest logits at each position, largest first, then the rest's logit as
    `rest_logit` gives it; their k token ids): [..., k + 1] and [..., k]. With k >= the
    vocabulary there is no rest and no bucket: [..., V] and [..., V]."""
    values, ids = teacher_logits.topk(min(k, teacher_logits.shape[-1]), dim=-1)
    if ids.shape[-1] == teacher_logits.shape[-1]:
        return values, ids
    return torch.cat([values, rest_logit(teacher_logits, ids, temperature)], dim=-1), ids


def rest_logit(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """The logit of one outcome "any token but `ids`" whose softmax at `temperature`, beside
    the `ids`' own logits, gives it the probability the whole softened distribution puts off
    them: T · logsumexp(logits / T) over the other tokens, [..., 1]."""
    rest = logits.scatter(-1, ids, float("-inf")) / temperature
    return temperature * rest.logsumexp(-1, keepdim=True)


def restricted_to_top_k(student_logits: torch.Tensor, top_logits: torch.Tensor, top_ids: torch.Tensor,
                        temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(student, teacher) logits over the teacher's top-k tokens and the rest's bucket (when
    `top_logits` has it: one column more than `top_ids`); a softmax over them is each
    distribution on those k + 1 outcomes."""
    student = student_logits.gather(-1, top_ids)
    if top_logits.shape[-1] > top_ids.shape[-1]:
        student = torch.cat([student, rest_logit(student_logits, top_ids, temperature)], dim=-1)
    return student, top_logits
