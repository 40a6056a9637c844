"""Which form of calibrated attention generalises: `macs_calibrated`'s one weight per layer against per-head weights
(AT2's form), fitted with the `calibrate` command's objective on training rows and scored by LDS on held-out rows.

Each row is measured as `calibrate.collect_row` measures it (MACS's per-layer log factors, 32 ablation masks of the
context's sentences, the answer's log-probability under each) and, here only, the per-head log factors
log(alpha a_lh + 1 - alpha) of the redistributed attention rows of each answer step, from one eager forward of the
prompt and answer (their maximum over heads is MACS's layer factor). Forms, each fitted on the training rows by
L-BFGS on minus the mean Pearson over each row's masks (plus the pull given):

- `macs`: no weights (w = 1);
- `layer`: log c = sum_l w_l log f_l, pull `l2` x mean (w - 1)^2 (the shipped form);
- `layer+head`: the above plus sum_lh v_lh log f_lh, pull `l2` x mean v^2 (v = 0 is `layer`);
- `head`: sum_lh v_lh log f_lh alone (no max over heads), pull towards 1/H;
- `at2`: AT2's linear form, a token's score sum_k sum_lh v_lh a_lh, no pull.

A source's score is the sum of its tokens' scores (exp of the log form, over the answer's steps), a mask's prediction
the sum of its kept sources' scores; the LDS of a held-out row is the Spearman correlation over its masks. Rows are
cached (.npz per row), so a rerun only fits.

Usage: python scripts/calibration_forms.py --data squad_v2-dev --train 200:210,250:300 --heldout 210:250 \
           --cache DIR [--dtype float32] [--results forms.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from explainer.eval import calibrate as cal
from explainer.eval.datasets import resolve_data
from explainer.eval.evaluate import load_squad
from explainer.eval.lds_eval import answer_row
from explainer.eval.metrics import spearman
from explainer.methods.macs import MACSConfig
from explainer.models.loading import load_model
from explainer.runtime.host import to_numpy
from explainer.runtime.precision import parse_dtype

FORMS = {"macs": (0.0,), "layer": (0.1, 0.01), "layer+head": (1.0, 0.1, 0.01), "head": (1.0, 0.1, 0.01), "at2": (0.0,)}


def head_log_factors(model, prompt_ids: list[int], answer_ids: list[int], config: MACSConfig) -> np.ndarray:
    """(K, L, H, N) float32 log(alpha a + 1 - alpha) of the redistributed attention rows (MACS's Eq. 4) of the
    queries that predict the K answer tokens, from one eager forward; the model's attention is restored after."""
    n, k = len(prompt_ids), len(answer_ids)
    ids = torch.tensor([prompt_ids + answer_ids[:-1]], device=next(model.parameters()).device)  # (1, N + K - 1)
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            attentions = model(input_ids=ids, output_attentions=True).attentions  # L x (1, H, T, T)
    finally:
        model.set_attn_implementation(previous)
    rows = torch.stack([a[0, :, n - 1 : n - 1 + k].transpose(0, 1).double() for a in attentions], dim=1)  # (K, L, H, T)
    a_in = rows[..., :n]
    if config.redistribute:
        a_in = a_in + rows[..., n:].sum(dim=-1, keepdim=True) / n
    return to_numpy(torch.log(config.alpha * a_in + 1.0 - config.alpha)).astype(np.float32)


def measure(bundle, row: dict, cfg: cal.CalibrateConfig) -> dict[str, np.ndarray]:
    """`calibrate.collect_row`'s arrays plus "heads": (K, L, H, P) per-head log factors over the sentence tokens."""
    t0 = time.perf_counter()
    answered = answer_row(bundle, row, ["macs"], cfg.max_new_tokens, {"macs": {"keep_layers": True}})
    arrays = cal.ablate_answered(bundle, row, answered, cfg, t0)
    attr, k = answered.attr, answered.k
    heads = head_log_factors(bundle.model, list(attr.prompt_token_ids), list(attr.generated_token_ids[:k]),
                             MACSConfig())  # fmt: skip
    return {**arrays, "heads": heads[..., [p for s in answered.sentences for p in s]]}


def _pearson(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a - a.mean(), b - b.mean()
    return (a * b).sum() / torch.sqrt((a * a).sum() * (b * b).sum() + 1e-300)


def predict(form: str, p: dict[str, torch.Tensor], e: dict[str, torch.Tensor]) -> torch.Tensor:
    """(M,) a form's prediction for each of a row's masks."""
    if form == "at2":
        tokens = torch.einsum("klhp,lh->p", (torch.exp(e["heads"]) - (1 - 0.8)) / 0.8, p["v"])  # raw attention
    else:
        if "w" in p:
            z = torch.einsum("klp,l->kp", e["features"], p["w"])  # (K, P)
        elif form == "macs":
            z = e["features"].sum(1)
        else:
            z = 0  # `head`: the per-head terms alone
        if "v" in p:
            z = z + torch.einsum("klhp,lh->kp", e["heads"], p["v"])
        tokens = torch.exp(z - z.max()).sum(dim=0)  # (P,)
    scores = torch.zeros(e["masks"].shape[1], dtype=tokens.dtype).index_add(0, e["source"], tokens)  # (S,)
    return e["masks"] @ scores


def start(form: str, layers: int, heads: int) -> dict[str, torch.Tensor]:
    """The form's parameters before fitting; `layer+head` starts at MACS (w = 1, v = 0), `head` at the mean."""
    one = torch.ones(layers, dtype=torch.float64)
    return {"macs": {}, "layer": {"w": one}, "layer+head": {"w": one, "v": torch.zeros(layers, heads).double()},
            "head": {"v": torch.full((layers, heads), 1.0 / heads).double()},
            "at2": {"v": torch.ones(layers, heads).double()}}[form]  # fmt: skip


def pull(form: str, p: dict[str, torch.Tensor], l2: float) -> torch.Tensor | float:
    if form == "layer":
        return l2 * ((p["w"] - 1) ** 2).mean()
    if form == "layer+head":
        return l2 * (((p["w"] - 1) ** 2).mean() + (p["v"] ** 2).mean())
    if form == "head":
        return l2 * ((p["v"] * p["v"].shape[1] - 1) ** 2).mean()
    return 0.0


def fit(form: str, rows: list[dict[str, torch.Tensor]], l2: float, iterations: int = 100) -> dict[str, torch.Tensor]:
    """A form's parameters fitted on `rows` (L-BFGS on minus the mean Pearson plus the pull)."""
    p = {name: t.clone().requires_grad_(True) for name, t in start(form, *rows[0]["heads"].shape[1:3]).items()}
    if not p:
        return p
    optimiser = torch.optim.LBFGS(list(p.values()), lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = -torch.stack([_pearson(predict(form, p, e), e["actual"]) for e in rows]).mean() + pull(form, p, l2)
        loss.backward()
        return loss

    optimiser.step(closure)
    return {name: t.detach() for name, t in p.items()}


def lds_values(form: str, p: dict[str, torch.Tensor], rows: list[dict[str, torch.Tensor]]) -> np.ndarray:
    with torch.no_grad():
        return np.array([spearman(to_numpy(e["actual"]), to_numpy(predict(form, p, e))) for e in rows])


def tensors(examples: list[dict[str, np.ndarray]]) -> list[dict[str, torch.Tensor]]:
    keep = [e for e in examples if np.ptp(e["actual"]) > 0]
    return [{k: torch.as_tensor(e[k], dtype=torch.long if k == "source" else torch.float64)
             for k in ("features", "heads", "source", "masks", "actual")} for e in keep]  # fmt: skip


def compare(train: list[dict], heldout: list[dict]) -> list[dict]:
    """Every form and pull: LDS on the training and held-out rows, and the held-out difference with MACS, paired
    (mean, 95% half-width)."""
    base = lds_values("macs", {}, heldout)
    out = []
    for form, pulls in FORMS.items():
        for l2 in pulls:
            t0 = time.perf_counter()
            p = fit(form, train, l2)
            held = lds_values(form, p, heldout)
            diff = held - base
            out.append({
                "form": form, "l2": l2, "train_lds": float(lds_values(form, p, train).mean()),
                "heldout_lds": float(held.mean()), "heldout_half_width": half(held), "vs_macs": float(diff.mean()),
                "vs_macs_half_width": half(diff), "parameters": sum(t.numel() for t in p.values()),
                "fit_seconds": time.perf_counter() - t0,
            })  # fmt: skip
            line = f"{form:11s} pull {l2:<5} train {out[-1]['train_lds']:.3f} held-out {held.mean():.3f} ± "
            print(line + f"{half(held):.3f}  vs MACS {diff.mean():+.3f} ± {half(diff):.3f}", file=sys.stderr)
    return out


def half(values: np.ndarray) -> float:
    return float(1.96 * values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")


def ranges(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (part.split(":") for part in text.split(","))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="SQuAD JSON file or squad_v2-dev (as for the calibrate command)")
    p.add_argument("--train", required=True, help="row ranges fitted on, e.g. 200:210,250:300")
    p.add_argument("--heldout", required=True, help="row ranges scored, e.g. 210:250 (never evaluation rows)")
    p.add_argument("--cache", required=True, help="folder of the measured rows (a rerun reuses them)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--results", default=None, help="JSON file for the table")
    args = p.parse_args(argv)
    data = resolve_data(args.data)
    pick = lambda spec: [r for a, b in ranges(spec) for r in load_squad(data, b - a, offset=a)]  # noqa: E731
    bundle = load_model(None, device="cpu" if not torch.cuda.is_available() else None, dtype=parse_dtype(args.dtype))
    cfg = cal.CalibrateConfig()
    got = {name: cal.collect(bundle, pick(spec), cfg, Path(args.cache), measure=measure)
           for name, spec in (("train", args.train), ("heldout", args.heldout))}  # fmt: skip
    table = compare(tensors(got["train"]["examples"]), tensors(got["heldout"]["examples"]))
    if args.results:
        facts = {"command": "python scripts/calibration_forms.py " + " ".join(sys.argv[1:] if argv is None else argv),
                 "train_rows": len(got["train"]["row_ids"]), "heldout_rows": len(got["heldout"]["row_ids"]),
                 "dtype": args.dtype, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        Path(args.results).write_text(json.dumps({**facts, "forms": table}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
