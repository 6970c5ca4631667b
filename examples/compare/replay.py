#!/usr/bin/env python3
"""Replays a run that `dsim export RUN --to DIR` wrote, with NumPy only.

From DIR's files alone (manifest.json, x.npy, y.npy, initial_params.npy,
batches.npy, batch_sizes.npy) it takes the same optimizer steps dsim took:
each step one device takes the replicas' batches concatenated in replica
order, sums the per-example loss gradients (in float64), multiplies by the
loss scale (1 / global_batch) and rounds to float32, then applies the
optimizer's update as the manifest states it, in float32. It then reports
the largest difference from dsim's final parameters (final_params.npy) and
checks the parameter checksums the manifest gives, computed here from the
algorithm it documents.

Over many steps float rounding (dsim sums in float32 in its own order, this
replay in float64) can be amplified until the two trajectories part: a
ReLU model, Adam, a large learning rate. When DIR has every step's
variables (params_per_step.npy: `dsim run --keep-params`, then `dsim
export --per-step`), the replay also takes each step from dsim's own
variables before it (its optimizer state its own) and reports the largest
difference of one step; the run is reproduced when that is within --tol,
whatever the end.

    python3 replay.py DIR [--tol 1e-6]

Exit status: 0 the replay is within --tol of dsim's final parameters (or,
with params_per_step.npy, every step is) and every checksum matches, 1 it
is not, 2 the folder cannot be read.
"""
import json
import os
import sys

import numpy as np

M64 = (1 << 64) - 1
PRIME = 0x100000001B3


def mix(h):
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M64
    return h ^ (h >> 33)


def checksum(params):
    """dsim_params_checksum, as the manifest's checksum.algorithm states it."""
    b = np.ascontiguousarray(params, dtype="<f4").tobytes()
    blocks = len(b) // 64
    words = np.frombuffer(b[: blocks * 64], dtype="<u8").reshape(blocks, 8)
    lanes = [(0xCBF29CE484222325 + 0x9E3779B97F4A7C15 * k) & M64 for k in range(8)]
    for k in range(8):
        h = lanes[k]
        for w in words[:, k].tolist():
            h = ((h ^ w) * PRIME) & M64
        lanes[k] = h
    r = len(b)
    for byte in b[blocks * 64 :]:
        r = ((r ^ byte) * PRIME) & M64
    for k in range(8):
        r = mix(r ^ mix((lanes[k] + k) & M64))
    return "%016x" % r


def loss_grad(model, p, x, y):
    """Sum over the examples of the per-example loss's gradient (float64)."""
    layers = model["layers"]
    acts, h = [], x.astype(np.float64)
    for i, L in enumerate(layers):
        W = p[L["w_offset"] : L["w_offset"] + L["out"] * L["in"]].reshape(L["out"], L["in"])
        b = p[L["b_offset"] : L["b_offset"] + L["out"]]
        acts.append(h)
        h = h @ W.T + b
        if i + 1 < len(layers):
            h = np.maximum(h, 0.0)
    if model["loss"] == "xent":
        z = h - h.max(axis=1, keepdims=True)
        sm = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        sm[np.arange(len(y)), y.astype(np.int64)] -= 1.0
        delta = sm
    else:
        delta = 2.0 * (h - y.reshape(h.shape)) / h.shape[1]
    g = np.zeros_like(p)
    for i in reversed(range(len(layers))):
        L = layers[i]
        W = p[L["w_offset"] : L["w_offset"] + L["out"] * L["in"]].reshape(L["out"], L["in"])
        g[L["w_offset"] : L["w_offset"] + L["out"] * L["in"]] = (delta.T @ acts[i]).ravel()
        g[L["b_offset"] : L["b_offset"] + L["out"]] = delta.sum(axis=0)
        if i > 0:
            delta = (delta @ W) * (acts[i] > 0)
    return g


class Optimizer:
    """The update rules of the manifest's optimizer.rule, in float32."""

    def __init__(self, spec, n, layers=()):
        self.s, self.t = spec, 0
        # lamb's variables: each layer's kernel, then its bias
        self.vars = [v for L in layers for v in ((L["w_offset"], L["out"] * L["in"]),
                                                 (L["b_offset"], L["out"]))]
        self.accum = np.zeros(n, np.float32)
        self.m = np.zeros(n, np.float32)
        self.v = np.zeros(n, np.float32)  # adam's v, adamax's u
        self.vhat = np.zeros(n, np.float32)  # adam's with amsgrad
        self.acc = np.zeros(n, np.float32)  # gradient_accumulation_steps
        self.mom = np.zeros(n, np.float32)  # rmsprop's momentum
        self.avg = np.zeros(n, np.float32)  # rmsprop's average gradient (centered)
        # adagrad's accumulator starts at initial_accumulator_value
        self.ada = np.full(n, spec.get("initial_accumulator_value", 0.0), np.float32)
        self.up = np.float32(1)  # nadam's u_product

    def clip(self, g):
        """The manifest's optimizer.clip: Keras's global_clipnorm or clipvalue."""
        s, f = self.s, np.float32
        if s.get("clipnorm", 0) > 0:  # each variable by its own norm (TF's clip_by_norm)
            c, g = f(s["clipnorm"]), g.copy()
            for off, n in self.vars or [(0, g.size)]:
                ss = np.sum(g[off : off + n].astype(np.float64) ** 2)
                l2 = f(np.sqrt(ss)) if ss > 0 else f(ss)
                g[off : off + n] = (g[off : off + n] * c) / (l2 if np.isnan(l2) else max(l2, c))
            return g.astype(np.float32)
        if s.get("global_clipnorm", 0) > 0:
            norm = np.sqrt(np.sum(g.astype(np.float64) ** 2))
            if not np.isfinite(norm):
                return np.full_like(g, np.nan)
            if norm > s["global_clipnorm"]:
                return (g * f(s["global_clipnorm"] / norm)).astype(np.float32)
        elif s.get("clipvalue", 0) > 0:
            c = f(s["clipvalue"])
            return np.clip(g, -c, c).astype(np.float32)
        return g

    def rate(self):
        """The manifest's optimizer.schedule at this step (Keras's schedules,
        float32), or learning_rate."""
        s, f = self.s, np.float32
        lr0, sc = f(s["learning_rate"]), s.get("schedule")
        if not sc:
            return lr0
        k, st = sc["kind"], f(self.t)
        if k == "piecewise_constant":
            i = sum(1 for b in sc["boundaries"] if self.t > b)
            return f(sc["values"][i])
        if k == "cosine_decay_restarts":  # Keras's SGDR, every operand float32
            a, tm, mm = f(sc["alpha"]), f(sc["t_mul"]), f(sc["m_mul"])
            fr = st / f(sc["first_decay_steps"])
            if tm == f(1):
                i = np.floor(fr)
                fr = fr - i
            else:
                i = np.floor(np.log(f(1) - fr * (f(1) - tm)) / np.log(tm))
                fr = (fr - (f(1) - np.power(tm, i)) / (f(1) - tm)) / np.power(tm, i)
            c = f(0.5) * np.power(mm, i) * (f(1) + np.cos(f(np.pi) * fr))
            return f(lr0 * ((f(1) - a) * c + a))
        ds = f(sc["decay_steps"])
        if k in ("exponential_decay", "inverse_time_decay"):
            p = st / ds
            if sc["staircase"]:
                p = np.floor(p)
            if k == "exponential_decay":
                return f(lr0 * np.power(f(sc["decay_rate"]), p))
            return f(lr0 / (f(1) + f(sc["decay_rate"]) * p))
        if k == "polynomial_decay":
            end = f(sc["end_learning_rate"])
            if sc["cycle"]:
                ds = ds * (f(1) if self.t == 0 else np.ceil(st / ds))
            else:
                st = np.minimum(st, ds)
            return f((lr0 - end) * np.power(f(1) - st / ds, f(sc["power"])) + end)

        def decay(x, frm):  # cosine_decay
            c = f(0.5) * (f(1) + np.cos(f(np.pi) * (x / ds)))
            return f(frm * (f(1.0 - sc["alpha"]) * c + f(sc["alpha"])))

        if "warmup_target" not in sc:
            return decay(np.minimum(st, ds), lr0)
        tg, ws = f(sc["warmup_target"]), f(sc["warmup_steps"])
        x = np.minimum(st, ds + ws)
        if x < ws:
            return f((tg - lr0) * (x / ws) + lr0)
        return decay(x - ws, tg)

    def apply(self, w, g):
        s, f = self.s, np.float32
        k = s.get("gradient_accumulation_steps", 0)
        if k > 1:  # the manifest's optimizer.accumulation
            if (self.t + 1) % k != 0:
                self.acc = (g + self.acc).astype(np.float32)
                self.t += 1
                return w
            g = ((g + self.acc) / f(k)).astype(np.float32)
            self.acc = np.zeros_like(self.acc)
        g = self.clip(g)
        lr = self.rate()
        if s.get("weight_decay", 0) > 0:  # the manifest's optimizer.decay
            w = (w - w * f(s["weight_decay"]) * lr).astype(np.float32)
        self.t += 1
        if s["kind"] == "sgd" and s["momentum"] > 0:  # Keras's: lr inside the velocity
            mo = f(s["momentum"])
            self.accum = self.accum * mo - g * lr
            if s["nesterov"]:
                return (w + (self.accum * mo - g * lr)).astype(np.float32)
            return (w + self.accum).astype(np.float32)
        if s["kind"] == "sgd":
            return (w - lr * g).astype(np.float32)
        if s["kind"] == "momentum":
            mo = f(s["momentum"])
            self.accum = mo * self.accum + g
            if s["nesterov"]:
                return (w - (lr * g + lr * mo * self.accum)).astype(np.float32)
            return (w - lr * self.accum).astype(np.float32)
        if s["kind"] == "rmsprop":  # Keras 3: epsilon inside the square root
            rho, eps = f(s["rho"]), f(s["epsilon"])
            self.v = rho * self.v + f(1.0 - s["rho"]) * (g * g)
            if s["centered"]:
                self.avg = rho * self.avg + f(1.0 - s["rho"]) * g
                d = (self.v - self.avg * self.avg) + eps
            else:
                d = self.v + eps
            inc = (lr * g) / np.sqrt(d)
            if s["momentum"] > 0:
                self.mom = f(s["momentum"]) * self.mom + inc
                return (w - self.mom).astype(np.float32)
            return (w - inc).astype(np.float32)
        if s["kind"] == "lion":  # Keras 3: the betas cast first, TF's sign
            b1, b2 = f(s["beta1"]), f(s["beta2"])
            c = self.m * b1 + g * (f(1) - b1)
            w = (w - lr * np.sign(c)).astype(np.float32)
            self.m = self.m * b2 + g * (f(1) - b2)
            return w
        if s["kind"] == "adadelta":  # Keras 3: m holds accumulated_grad, v the deltas'
            rho, omr, eps = f(s["rho"]), f(1.0 - s["rho"]), f(s["epsilon"])
            self.m = rho * self.m + omr * (g * g)
            d = -((np.sqrt(self.v + eps) * g) / np.sqrt(self.m + eps))
            self.v = rho * self.v + omr * (d * d)
            return (w + lr * d).astype(np.float32)
        if s["kind"] == "adagrad":
            self.ada = self.ada + g * g
            return (w - (lr * g) / np.sqrt(self.ada + f(s["epsilon"]))).astype(np.float32)
        b1, b2, t = s["beta1"], s["beta2"], self.t
        if s["kind"] == "lamb":  # Keras 3: a trust ratio per variable
            c1, c2 = f(1) - np.power(f(b1), f(t)), f(1) - np.power(f(b2), f(t))
            self.m = self.m + (g - self.m) * f(1.0 - b1)
            self.v = self.v + (g * g - self.v) * f(1.0 - b2)
            u = ((self.m / c1) / (np.sqrt(self.v / c2) + f(s["epsilon"]))).astype(np.float32)
            w = w.copy()
            for off, n in self.vars or [(0, w.size)]:
                wn = f(np.sqrt(np.sum(w[off : off + n].astype(np.float64) ** 2)))
                un = f(np.sqrt(np.sum(u[off : off + n].astype(np.float64) ** 2)))
                r = wn / un if wn > 0 and un > 0 else f(1)
                w[off : off + n] = w[off : off + n] - (f(r) * lr) * u[off : off + n]
            return w.astype(np.float32)
        if s["kind"] == "nadam":  # Keras 3: u_product over the update steps, float32
            b1, b2, ft = f(b1), f(b2), f(t)
            ut = b1 * (f(1) - f(0.5) * np.power(f(0.96), ft))
            ut1 = b1 * (f(1) - f(0.5) * np.power(f(0.96), f(t + 1)))
            self.up = (self.up * b1) * (f(1) - f(0.5) * np.power(f(0.96), ft))
            up1 = self.up * ut1
            self.m = self.m + (g - self.m) * (f(1) - b1)
            self.v = self.v + (g * g - self.v) * (f(1) - b2)
            mh = (ut1 * self.m) / (f(1) - up1) + ((f(1) - ut) * g) / (f(1) - self.up)
            vh = self.v / (f(1) - np.power(b2, ft))
            return (w - (mh * lr) / (np.sqrt(vh) + f(s["epsilon"]))).astype(np.float32)
        if s["kind"] == "adamax":  # Keras 3: a running maximum of |g|
            c = f(1 - b1**t)
            self.m = self.m + (g - self.m) * f(1.0 - b1)
            self.v = np.maximum(f(b2) * self.v, np.abs(g))
            return (w - (lr * self.m) / (c * (self.v + f(s["epsilon"])))).astype(np.float32)
        lr64 = float(lr) if s.get("schedule") else s["learning_rate"]
        alpha = f(lr64 * np.sqrt(1 - b2**t) / (1 - b1**t))
        self.m = self.m + (g - self.m) * f(1.0 - b1)
        self.v = self.v + (g * g - self.v) * f(1.0 - b2)
        if s.get("amsgrad"):  # Keras's Adam(amsgrad=True): the running maximum of v
            self.vhat = np.maximum(self.vhat, self.v)
            return (w - self.m * alpha / (np.sqrt(self.vhat) + f(s["epsilon"]))).astype(np.float32)
        return (w - self.m * alpha / (np.sqrt(self.v) + f(s["epsilon"]))).astype(np.float32)


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    d, tol = argv[1], 1e-6
    if "--tol" in argv:
        tol = float(argv[argv.index("--tol") + 1])
    try:
        man = json.load(open(os.path.join(d, "manifest.json")))
        ld = lambda name: np.load(os.path.join(d, name), allow_pickle=False)
        x, y = ld("x.npy"), ld("y.npy")
        p0, want = ld("initial_params.npy"), ld("final_params.npy")
        batches, sizes = ld("batches.npy"), ld("batch_sizes.npy")
    except (OSError, ValueError) as e:
        print("replay.py: %s: %s" % (d, e), file=sys.stderr)
        return 2
    model, bat = man["model"], man["batching"]
    if model["kind"] == "plugin":
        print("replay.py: %s: the run's model is plugin %s, whose layers only its own code "
              "knows; this script replays the built-in models" % (d, model["plugin"]),
              file=sys.stderr)
        return 2
    scale = np.float32(bat["loss_scale"])

    def step(opt, p, s):
        ids = np.concatenate([batches[s, r, : sizes[s, r]] for r in range(batches.shape[1])])
        g = (loss_grad(model, p.astype(np.float64), x[ids], y[ids]) * float(scale)).astype(
            np.float32
        )
        return opt.apply(p, g)

    p = p0.astype(np.float32)
    opt = Optimizer(man["optimizer"], p.size, model["layers"])
    for s in range(batches.shape[0]):
        p = step(opt, p, s)
    diff = float(np.max(np.abs(p.astype(np.float64) - want))) if p.size else 0.0
    # step by step from dsim's own variables, when the export has them
    worst, rows = None, None
    if os.path.exists(os.path.join(d, "params_per_step.npy")):
        try:
            rows = ld("params_per_step.npy")
        except (OSError, ValueError) as e:
            print("replay.py: %s: %s" % (d, e), file=sys.stderr)
            return 2
    if rows is not None and rows.shape[0] == batches.shape[0] and p0.size:
        opt2, prev = Optimizer(man["optimizer"], p0.size, model["layers"]), p0.astype(np.float32)
        worst = 0.0
        for s in range(rows.shape[0]):
            q = step(opt2, prev, s)
            worst = max(worst, float(np.max(np.abs(q.astype(np.float64) - rows[s]))))
            prev = rows[s].astype(np.float32)
    cs = man["checksum"]
    ok_cs = checksum(p0) == cs["initial"] and checksum(want) == cs["final"]
    print(
        "replayed %d steps of run %d (%s, %s, %s, %d replicas) from %s"
        % (
            batches.shape[0],
            man["run"],
            man["scenario"],
            model["kind"],
            man["optimizer"]["kind"],
            man["cluster"]["replicas"],
            d,
        )
    )
    print("largest difference from dsim's final parameters: %.3g (allowed %.3g)" % (diff, tol))
    if worst is not None:
        print(
            "step by step from dsim's own variables (params_per_step.npy): largest difference "
            "of one step %.3g (allowed %.3g)%s"
            % (
                worst,
                tol,
                "; float rounding, amplified over the steps, parted the two trajectories"
                if diff > tol and worst <= tol
                else "",
            )
        )
    print(
        "checksums (initial %s, final %s) computed here from the documented algorithm: %s"
        % (cs["initial"], cs["final"], "match" if ok_cs else "DIFFER")
    )
    ok = diff <= tol or (worst is not None and worst <= tol)
    return 0 if ok and ok_cs else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
