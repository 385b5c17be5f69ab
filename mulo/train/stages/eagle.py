"""The ``eagle`` stage of the twemoji pipeline: EAGLE-2's feature-level draft head, trained on the
frozen target (``mulo.models.eagle``; the method is ``mulo.methods.eagle2``)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mulo.models.eagle import EagleHead
from mulo.models.gpt import GPT
from mulo.train.loop import autocast, init_weights, train
from mulo.train.stages.ar import ar_batch, ar_data, load_stage


def load_target(pipe) -> GPT:
    """The run's trained target, frozen, on the pipeline's device."""
    return load_stage(pipe, "target").requires_grad_(False)


def train_eagle_head(pipe) -> None:
    """EAGLE's draft head, trained on the frozen target's own features (teacher-forced on the
    training sequences, under the AR stages' text mix and CFG dropout, so both guidance branches
    are in distribution): at slot s it reads the target's feature f_s, perturbed by uniform noise
    (at generation it reads its own imperfect predictions), and the embedded input at s + 1,
    and is trained to predict f_{s+1} (smooth L1) and the target's next-token distribution
    from it (cross-entropy against the target's probabilities, weight ``eagle_cls_weight``)."""
    target = load_target(pipe)
    data = ar_data(pipe, pipe.recipe.grid("target"))
    torch.manual_seed(pipe.seed + 7)
    head = EagleHead(target.config)
    head.apply(init_weights)
    head.to(pipe.device)
    n_cond = target.config.cond_len
    b = pipe.budget

    @torch.no_grad()
    def target_features(x, cond):
        """Embedded inputs and the target's features at every slot ``[B, T + L - 1, dim]``."""
        embedded = target.embed_sequence(cond, x[:, :-1])
        slots = torch.arange(embedded.shape[1], device=pipe.device)
        with autocast(pipe.device):
            features = target.forward_hidden(embedded, slots, position_inputs=target.position_inputs(cond))
        return embedded, features.float()

    def head_loss(x, cond, noise: float, rng=None):
        embedded, features = target_features(x, cond)
        inputs = features[:, :-1]
        if noise:
            gen = torch.Generator(device=pipe.device).manual_seed(int(rng.integers(2**31)))
            inputs = inputs + noise * (2 * torch.rand(inputs.shape, generator=gen, device=pipe.device) - 1)
        slots = torch.arange(inputs.shape[1], device=pipe.device)
        with autocast(pipe.device):
            predicted = head(target, inputs, embedded[:, 1:], slots)
        # Only slots whose next feature predicts an image token (from the last condition slot on).
        predicted, wanted = predicted[:, n_cond - 1 :].float(), features[:, n_cond:]
        log_q = torch.log_softmax(target.output(predicted).float(), -1)
        p = torch.softmax(target.output(wanted).float(), -1)
        regression = F.smooth_l1_loss(predicted, wanted)
        classification = -(p * log_q).sum(-1).mean()
        return regression, classification, (log_q.argmax(-1) == p.argmax(-1)).float().mean(), p, log_q

    def loss_fn(step):
        rng = np.random.default_rng([pipe.seed, sum(map(ord, "eagle")), step])
        x, cond = ar_batch(pipe, data, rng, b.eagle_batch, step)
        regression, classification, *_ = head_loss(x, cond, b.eagle_noise, rng)
        return regression + b.eagle_cls_weight * classification

    stats = train(
        "eagle",
        head,
        loss_fn,
        b.eagle_steps,
        pipe.run / "eagle.ckpt",
        lr=pipe.recipe.hyper.eagle_lr,
        every=b.checkpoint_every,
    )
    # On validation images named by their names: how often the head's most likely next token
    # is the target's, and the target's probability of it (the acceptance rate of a one-node
    # tree at temperature 1, guidance off).
    val = np.flatnonzero(data.is_val)
    with torch.no_grad():
        agree, accept = [], []
        for i in range(0, len(val), 16):
            idx = val[i : i + 16]
            _, _, top1, p, log_q = head_loss(data.tokens[idx].to(pipe.device), data.cond_name[idx].to(pipe.device), 0)
            agree.append(float(top1) * len(idx))
            accept.append(float(p.gather(-1, log_q.argmax(-1, keepdim=True)).mean()) * len(idx))
    torch.save(head.state_dict(), pipe.run / "eagle.pt")
    pipe.record(
        "eagle",
        **stats,
        val_top1_agreement=round(sum(agree) / len(val), 4),
        val_top1_target_prob=round(sum(accept) / len(val), 4),
        params=sum(p.numel() for p in head.parameters()),
    )
