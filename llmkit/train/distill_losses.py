"""The losses of knowledge distillation (`llmkit distill`), pure functions of logits.

`generalized_jsd` is GKD's generalised Jensen–Shannon divergence (Agarwal et al. 2024, Eq. 1) as
TRL's `GKDTrainer.generalized_jsd_loss` computes it, per position: both distributions are
softened by the temperature (no T² factor, as TRL's), the mixture is (1 − β)·student + β·teacher,
and β = 0 / 1 are the forward KL(teacher ‖ student) / reverse KL(student ‖ teacher) themselves.
`restricted_to_top_k` is what a top-k teacher sees: both distributions renormalised over the
teacher's k likeliest tokens, so a teacher stored as its top-k logits gives the loss its whole
logits would give restricted to those tokens.
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


def teacher_top_k(teacher_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the k largest logits at each position, their token ids), largest first: [..., k] each."""
    values, ids = teacher_logits.topk(min(k, teacher_logits.shape[-1]), dim=-1)
    return values, ids


def restricted_to_top_k(student_logits: torch.Tensor, top_logits: torch.Tensor,
                        top_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(student, teacher) logits over the teacher's top-k tokens only; a softmax over them is
    each distribution renormalised on that support."""
    return student_logits.gather(-1, top_ids), top_logits
