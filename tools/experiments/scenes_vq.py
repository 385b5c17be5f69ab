"""Which VQ the scenes family can afford (issue 63): the referee's prompt match on held-out scenes
reconstructed by a candidate VQ, against its training steps and CPU seconds.

The study's VQ (32 codes, 400 steps on 32 px windows, decoded whole) scored 0.0: its GroupNorm
sees whole scenes at inference and windows in training, and 32 codes draw too little of a 32 px
emoji (benchmarks/scenes-vq-probe.json). A candidate here varies the codebook, the widths and how
it reads an image: ``--tile 32`` trains on 32 px windows aligned to the sprites' 8 px grid and
encodes/decodes every image as 32 px tiles (so what it sees at inference is what it trained on);
``--tile 0`` trains and reads whole images, ``--batch`` split equally over the three sizes (the
runs of 2026-11-28 took 8 / 4 / 4 at 128 / 64 / 32 px, their losses weighted by count).
``--fold 4`` reads each 4 x 4 pixel square as one position of 48 channels (``mulo.models.vq``:
every layer at the token grid, the last one writing a token's pixels directly; ``--widths`` then
names one width). ``--busy`` is the share of windows drawn among those that hold part of an object (flat windows
cost as much and teach little).

    python tools/experiments/scenes_vq.py --name t32-c512 --codes 512 --steps 1500
    (resumes from runs/scenes-vq/<name>/ when stopped; the log is runs/scenes-vq/<name>/log.json)
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from diffusers import VQModel

from mulo.eval.referee import Referee
from mulo.models.vq import VQTokenizer
from mulo.train import scenes
from mulo.train.recipes import Hyper, vq_config
from mulo.train.stages.vq import Windows, fit_vq

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
    parser.add_argument(
        "--fold", type=int, default=1, help="pixels a side read as one position (4: every layer at the token grid)"
    )
    parser.add_argument("--norm", default="group", choices=("group", "spatial"), help="the decoder's normalisation")
    parser.add_argument("--tile", type=int, default=32)
    parser.add_argument("--busy", type=float, default=0.75)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument(
        "--batch", type=int, default=48, help="windows a step: by the tiles each size holds (--tile), else equally"
    )
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--scenes", type=int, default=3072)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--placement", default="free", help="the scenes' placement (SceneConfig.placement)")
    parser.add_argument(
        "--art", type=int, default=0, help="emoji drawn at this many px, then enlarged to 32 px by repeating pixels"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    folder = Path("runs/scenes-vq") / args.name
    folder.mkdir(parents=True, exist_ok=True)

    config = scenes.SceneConfig(placement=args.placement)
    sheet = scenes.sprites(CACHE, config.object_px, config.canvas)
    if args.art:  # pixel art: fewer distinct 4 px patches for the VQ to tell apart
        small = scenes.sprites(CACHE, args.art, config.canvas)
        factor = config.object_px // args.art
        big = np.repeat(np.repeat(small.rgba, factor, axis=2), factor, axis=3)
        sheet = scenes.Sprites(small.names, small.styles, big, config.canvas)
    stream = scenes.SceneStream(config, sheet, seed=0)
    referee = Referee(sheet.subset(config.names))
    variant = (f"-art{args.art}" if args.art else "") + ("" if args.placement == "free" else f"-{args.placement}")
    cache = Path("runs/scenes-vq") / f"data-{args.scenes}{variant}.npz"
    if not cache.exists():
        rendered = [stream.render(s) for s in stream.scenes(0, args.scenes)]
        np.savez(cache, **{str(px): np.stack([r[px] for r in rendered]) for px in config.scales})
    with np.load(cache) as z:
        data = {int(px): torch.from_numpy(z[px]).permute(0, 3, 1, 2).float() / 255 for px in z.files}
    held = stream.scenes(0, EVAL_SCENES, scenes.HELD_OUT)
    held_images = torch.from_numpy(np.stack([stream.render(s)[config.canvas] for s in held])).permute(0, 3, 1, 2)
    held_images = held_images.float() / 255

    widths = tuple(int(w) for w in args.widths.split(","))
    model = {"block_out_channels": widths, "vq_embed_dim": args.embed, "norm_num_groups": min(16, widths[0])}
    vq = VQModel(**vq_config(args.codes, 4, **model, norm_type=args.norm, fold=args.fold))
    tile = args.tile
    hyper = replace(Hyper(), vq_lr=args.lr, vq_tile=tile, vq_busy=args.busy)
    images = [data[px] for px in sorted(data, reverse=True)]
    # windows on the sprites' grid; with objects on the tiles' grid, the tiles themselves
    grid = tile if args.placement == "tiles" else 8
    windows = Windows(images, np.random.default_rng(0), crop=max(data), tile=tile, busy=args.busy, grid=grid)

    log_path = folder / "log.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else {"args": vars(args), "evals": []}
    clock = {"start": time.perf_counter()}

    def evaluate(step: int) -> None:
        vq.eval()
        recon = torch.cat([reconstruct(vq, held_images[i : i + 16], tile) for i in range(0, len(held_images), 16)])
        squared = ((recon - held_images) ** 2).mean(1)
        mse = float(squared.mean())
        # the objects' pixels (those off the scene's background colour), where the referee looks
        objects = (held_images - held_images[:, :, :1, :1]).abs().amax(1) > 0.02
        pictures = (recon * 255).round().byte().permute(0, 2, 3, 1).numpy()
        match = np.mean([referee.prompt_match(p, s.prompt).match for p, s in zip(pictures, held, strict=True)])
        entry = {
            "step": step,
            "psnr_128": round(10 * np.log10(1 / mse), 2),
            "psnr_objects": round(10 * np.log10(1 / float(squared[objects].mean())), 2),
            "referee_match": round(float(match), 4),
            # wall seconds since this process started training, evaluations included (not across resumes)
            "train_seconds": round(time.perf_counter() - clock["start"], 1),
        }
        log["evals"].append(entry)
        log_path.write_text(json.dumps(log, indent=1) + "\n")
        print(json.dumps(entry), flush=True)
        vq.train()

    def on_step(step):
        if (step + 1) % args.eval_every == 0 and not any(e["step"] == step + 1 for e in log["evals"]):
            evaluate(step + 1)

    stats = fit_vq(args.name, vq, windows, args.batch, args.steps, folder / "vq.ckpt", hyper, 100, on_step)
    log["stats"] = {k: v for k, v in stats.items() if k in ("seconds", "final_loss")}
    if not any(e["step"] == args.steps for e in log["evals"]):
        evaluate(args.steps)
    log_path.write_text(json.dumps(log, indent=1) + "\n")
    torch.save(vq.state_dict(), folder / "vq.pt")


if __name__ == "__main__":
    main()
