"""The scenes referee (``mulo.eval.referee``) measured (issue 63): its prompt match on generated
scenes as they are, blurred in ways a tokenizer blurs, and reconstructed by the shipped
``twemoji`` VQ (the issue's bar for reusing that VQ: >= 98 %), and its time per image.

    python tools/experiments/scenes_referee.py [--scenes 200] [--out benchmarks/scenes-referee.json]

Needs the training extras (the sprites are rendered from the styles' npm packages once, into
``~/.cache/mulo/styles``) and assets/twemoji.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFilter

from mulo.eval.referee import Referee
from mulo.families.emoji import load_vq
from mulo.train import scenes

CACHE = Path.home() / ".cache" / "mulo" / "styles"


def gaussian(images: np.ndarray, sigma: float) -> np.ndarray:
    return np.stack([np.asarray(Image.fromarray(i).filter(ImageFilter.GaussianBlur(sigma))) for i in images])


def down_up(images: np.ndarray, factor: int) -> np.ndarray:
    """Area-reduced ``factor`` times, then bilinear back: what a coarser tokenizer keeps."""
    px = images.shape[1]
    return np.stack(
        [np.asarray(Image.fromarray(i).reduce(factor).resize((px, px), Image.Resampling.BILINEAR)) for i in images]
    )


def jpeg(images: np.ndarray, quality: int) -> np.ndarray:
    out = []
    for i in images:
        buffer = io.BytesIO()
        Image.fromarray(i).save(buffer, "JPEG", quality=quality)
        out.append(np.asarray(Image.open(buffer).convert("RGB")))
    return np.stack(out)


@torch.no_grad()
def twemoji_vq(images: np.ndarray) -> np.ndarray:
    tok = load_vq(Path("assets/twemoji"))
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    out = torch.cat([tok.decode(tok.encode(x[i : i + 25])) for i in range(0, len(x), 25)])
    return (out.clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).numpy()


def score(referee: Referee, images: np.ndarray, scene_list) -> dict:
    matches, reasons, seconds = 0, Counter(), []
    for image, scene in zip(images, scene_list, strict=True):
        start = time.perf_counter()
        verdict = referee.prompt_match(image, scene.prompt)
        seconds.append(time.perf_counter() - start)
        matches += verdict.match
        reasons.update(
            [
                *(["missing"] if verdict.missing else []),
                *(["extra emoji"] if verdict.extra or verdict.repeated else []),
                *(["something else"] if verdict.reading.unknown else []),
                *(["background"] if not verdict.background_ok else []),
            ]
        )
    return {
        "prompt_match": round(matches / len(images), 4),
        "failures_by_reason": dict(reasons),
        "ms_per_image_median": round(1000 * float(np.median(seconds)), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/scenes-referee.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = scenes.SceneConfig()
    sheet = scenes.sprites(CACHE, config.object_px, config.canvas)
    stream = scenes.SceneStream(config, sheet, seed=0)
    referee = Referee(sheet.subset(config.names))
    half = args.scenes // 2
    scene_list = stream.scenes(0, args.scenes - half) + stream.scenes(0, half, scenes.HELD_OUT)
    clean = np.stack([stream.render(s)[config.canvas] for s in scene_list])
    variants = {
        "clean": clean,
        "gaussian_blur_sigma_1": gaussian(clean, 1.0),
        "gaussian_blur_sigma_2": gaussian(clean, 2.0),
        "down_up_2x": down_up(clean, 2),
        "down_up_4x": down_up(clean, 4),
        "jpeg_quality_30": jpeg(clean, 30),
        "twemoji_vq": twemoji_vq(clean),
    }
    results = {name: score(referee, images, scene_list) for name, images in variants.items()}
    for name, result in results.items():
        print(f"{name:24s} {result}")
    counts = Counter(len(s.objects) for s in scene_list)
    report = {
        "scenes": args.scenes,
        "held_out_scenes": half,
        "objects_per_scene": {str(k): v for k, v in sorted(counts.items())},
        "config": {k: v for k, v in vars(config).items()},
        "vocabulary": len(config.names),
        "styles": list(config.styles),
        "twemoji_vq_bar": 0.98,
        "twemoji_vq_reusable": results["twemoji_vq"]["prompt_match"] >= 0.98,
        "results": results,
        "conditions": "2-core CPU shared with other jobs (times are loaded), numpy single-threaded",
    }
    args.out.write_text(json.dumps(report, indent=1, default=list) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
