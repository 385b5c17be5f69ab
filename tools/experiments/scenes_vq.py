"""Which VQ the scenes family can afford (issue 63): the referee's prompt match on held-out scenes
reconstructed by a candidate VQ, against its training steps and CPU seconds.

The study's VQ (32 codes, 400 steps on 32 px windows, decoded whole) scored 0.0: its GroupNorm
sees whole scenes at inference and windows in training, and 32 codes draw too little of a 32 px
emoji (benchmarks/scenes-vq-probe.json). A candidate here varies the codebook, the widths and how
it reads an image: ``--tile 32`` trains on 32 px windows aligned to the sprites' 8 px grid and
encodes/decodes every image as 32 px tiles (so what it sees at inference is what it trained on);
``--tile 0`` trains and reads whole images. ``--busy`` is the share of windows drawn among those
that hold part of an object (flat windows cost as much and teach little).

    python tools/experiments/scenes_vq.py --name t32-c512 --codes 512 --steps 1500
    (resumes from runs/scenes-vq/<name>/ when stopped; the log is runs/scenes-vq/<name>/log.json)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import VQModel

from mulo.eval.referee import Referee
from mulo.models.vq import VQTokenizer
from mulo.train import scenes
from mulo.train.loop import train
from mulo.train.recipes import VQ_CONFIG

CACHE = Path.home() / ".cache" / "mulo" / "styles"
EVAL_SCENES = 96  # held-out scenes (at least two objects, a held-out combination among them)


def reconstruct(vq: VQModel, images: torch.Tensor, tile: int) -> torch.Tensor:
    """[0, 1] images through the VQ (encode, quantize, decode), tiled as it trained."""
    tok = VQTokenizer(vq.eval(), tile)
    return tok.decode(tok.encode(images))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--codes", type=int, default=512)
    parser.add_argument("--widths", default="32,64,64")
    parser.add_argument("--embed", type=int, default=8)
    parser.add_argument("--norm", default="group", choices=("group", "spatial"), help="the decoder's normalisation")
    parser.add_argument("--tile", type=int, default=32)
    parser.add_argument("--busy", type=float, default=0.75)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument(
        "--batch", type=int, default=48, help="windows a step (--tile): spread over the sizes by their tiles"
    )
    parser.add_argument("--whole", default="8,4,4", help="without --tile: whole images a step at 128, 64, 32 px")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--scenes", type=int, default=3072)
    parser.add_argument("--eval-every", type=int, default=250)
    args = parser.parse_args()
    torch.set_num_threads(2)
    folder = Path("runs/scenes-vq") / args.name
    folder.mkdir(parents=True, exist_ok=True)

    config = scenes.SceneConfig()
    sheet = scenes.sprites(CACHE, config.object_px, config.canvas)
    stream = scenes.SceneStream(config, sheet, seed=0)
    referee = Referee(sheet.subset(config.names))
    cache = Path("runs/scenes-vq") / f"data-{args.scenes}.npz"
    if not cache.exists():
        rendered = [stream.render(s) for s in stream.scenes(0, args.scenes)]
        np.savez(cache, **{str(px): np.stack([r[px] for r in rendered]) for px in config.scales})
    with np.load(cache) as z:
        data = {int(px): torch.from_numpy(z[px]).permute(0, 3, 1, 2).float() / 255 for px in z.files}
    held = stream.scenes(0, EVAL_SCENES, scenes.HELD_OUT)
    held_images = torch.from_numpy(np.stack([stream.render(s)[config.canvas] for s in held])).permute(0, 3, 1, 2)
    held_images = held_images.float() / 255

    widths = tuple(int(w) for w in args.widths.split(","))
    vq = VQModel(
        **{
            **VQ_CONFIG,
            "block_out_channels": widths,
            "num_vq_embeddings": args.codes,
            "vq_embed_dim": args.embed,
            "norm_num_groups": min(16, widths[0]),
            "norm_type": args.norm,
        }
    )
    rng = np.random.default_rng(0)
    sizes = sorted(data, reverse=True)
    tile = args.tile
    # windows per size in proportion to the tiles each holds (16 : 4 : 1 at 128 / 64 / 32 px)
    share = np.array([(px // tile) ** 2 if tile else 1 for px in sizes], dtype=float)
    share /= share.sum()
    recent = {}
    usage = torch.zeros(args.codes)

    def windows(px: int, count: int) -> torch.Tensor:
        images = data[px]
        idx = rng.integers(0, len(images), size=count * (4 if args.busy else 1))
        if not tile or px <= tile:
            return images[idx[:count]]
        grid = np.arange(0, px - tile + 1, 8)  # the sprites' 8 px grid: token phase as at inference
        tops, lefts = rng.choice(grid, size=len(idx)), rng.choice(grid, size=len(idx))
        crops = torch.stack(
            [images[i, :, t : t + tile, s : s + tile] for i, t, s in zip(idx, tops, lefts, strict=True)]
        )
        if not args.busy:
            return crops
        spread = crops.flatten(2).std(dim=2).mean(dim=1)  # ~0 for a flat window
        busy = (spread > 0.02).nonzero()[:, 0]
        flat = (spread <= 0.02).nonzero()[:, 0]
        n_busy = min(len(busy), int(round(count * args.busy)))
        pick = torch.cat([busy[:n_busy], flat[: count - n_busy]])
        if len(pick) < count:
            pick = torch.cat([pick, busy[n_busy : n_busy + count - len(pick)]])
        return crops[pick]

    whole = [int(n) for n in args.whole.split(",")]
    batch = args.batch if tile else sum(whole)

    def loss_fn(step):
        counts = rng.multinomial(args.batch, share) if tile else whole
        total = 0.0
        for px, count in zip(sizes, counts, strict=True):
            if not count:
                continue
            x = windows(px, int(count)) * 2 - 1
            latents = vq.encode(x).latents
            quant, commit, (_, _, used) = vq.quantize(latents)
            recon = vq.decode(quant, force_not_quantize=True).sample
            total = total + (F.mse_loss(recon, x) + 0.5 * F.l1_loss(recon, x) + commit) * count / batch
            if px == sizes[0]:
                recent.update(latents=latents.detach(), codes=used.detach())
        return total

    log_path = folder / "log.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else {"args": vars(args), "evals": []}
    clock = {"start": time.perf_counter()}

    def evaluate(step: int) -> None:
        vq.eval()
        recon = torch.cat([reconstruct(vq, held_images[i : i + 16], tile) for i in range(0, len(held_images), 16)])
        mse = float(((recon - held_images) ** 2).mean())
        pictures = (recon * 255).round().byte().permute(0, 2, 3, 1).numpy()
        match = np.mean([referee.prompt_match(p, s.prompt).match for p, s in zip(pictures, held, strict=True)])
        entry = {
            "step": step,
            "psnr_128": round(10 * np.log10(1 / mse), 2),
            "referee_match": round(float(match), 4),
            "codes_used": int((usage > 0.05).sum()),
            # wall seconds since this process started training, evaluations included (not across resumes)
            "train_seconds": round(time.perf_counter() - clock["start"], 1),
        }
        log["evals"].append(entry)
        log_path.write_text(json.dumps(log, indent=1) + "\n")
        print(json.dumps(entry), flush=True)
        vq.train()

    def on_step(step):
        with torch.no_grad():
            used = recent["codes"].reshape(-1)
            usage.mul_(0.99).index_add_(0, used, torch.ones(used.numel()))
            if (step + 1) % 100 == 0:
                dead = (usage < 0.05).nonzero()[:, 0]
                if len(dead):
                    lat = recent["latents"].permute(0, 2, 3, 1).reshape(-1, recent["latents"].shape[1])
                    vq.quantize.embedding.weight[dead] = lat[torch.randint(len(lat), (len(dead),))]
                    usage[dead] = 1.0
        if (step + 1) % args.eval_every == 0 and not any(e["step"] == step + 1 for e in log["evals"]):
            evaluate(step + 1)

    stats = train(args.name, vq, loss_fn, args.steps, folder / "vq.ckpt", lr=args.lr, every=100, on_step=on_step)
    log["stats"] = {k: v for k, v in stats.items() if k in ("seconds", "final_loss")}
    if not any(e["step"] == args.steps for e in log["evals"]):
        evaluate(args.steps)
    log_path.write_text(json.dumps(log, indent=1) + "\n")
    torch.save(vq.state_dict(), folder / "vq.pt")


if __name__ == "__main__":
    main()
