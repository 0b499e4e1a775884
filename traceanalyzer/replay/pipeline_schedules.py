"""Pipeline schedules as torch runs them (GPipe, 1F1B, Interleaved1F1B): the order of each rank's
actions, the sends each action waits for, and the theoretical bubble (see replay/pipeline.py)."""
from __future__ import annotations

from ..errors import TraceAnalyzerError

SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")


def schedule_order(schedule: str, n_ranks: int, microbatches: int, stages_per_rank: int = 1) -> dict:
    """Each rank's ordered compute actions ``(stage, "F"|"B", mb)``, as torch.distributed.pipelining
    runs them: GPipe all forwards then all backwards; 1F1B ``Schedule1F1B._step_microbatches``
    (stage s first runs min(m, p - s) forwards, then backward/forward pairs, then the remaining
    backwards); Interleaved1F1B ``ScheduleInterleaved1F1B._calculate_single_rank_operations``."""
    p, m, v = int(n_ranks), int(microbatches), int(stages_per_rank)
    if schedule not in SCHEDULES:
        raise TraceAnalyzerError(f"pipeline what-if: unknown schedule '{schedule}' (known: {', '.join(SCHEDULES)})")
    if p < 1 or m < 1 or v < 1:
        raise TraceAnalyzerError(f"pipeline what-if: need ranks, micro-batches and stages per rank >= 1 "
                                 f"(got {p}, {m}, {v})")
    if schedule != "interleaved1f1b":
        if v != 1:
            raise TraceAnalyzerError(f"pipeline what-if: {schedule} runs one stage per rank (got {v})")
        if schedule == "1f1b" and m < p:
            raise TraceAnalyzerError(f"pipeline what-if: 1f1b needs at least as many micro-batches as stages ({m} < {p})")
        return {r: (_gpipe(r, m) if schedule == "gpipe" else _one_f_one_b(r, p, m)) for r in range(p)}
    return {r: _interleaved(r, p, m, v) for r in range(p)}


def _gpipe(s: int, m: int) -> list:
    return [(s, "F", i) for i in range(m)] + [(s, "B", i) for i in range(m)]


def _one_f_one_b(s: int, p: int, m: int) -> list:
    warmup = min(m, p - s)
    out = [(s, "F", i) for i in range(warmup)]
    f, b = warmup, 0
    while True:
        out.append((s, "B", b))
        b += 1
        if f == m:
            break
        out.append((s, "F", f))
        f += 1
    out += [(s, "B", i) for i in range(b, m)]
    return out


def _interleaved(rank: int, p: int, m: int, v: int) -> list:
    rounds = max(1, m // p)
    per_round = m // rounds
    if m % rounds:
        raise TraceAnalyzerError(f"pipeline what-if: interleaved1f1b needs the micro-batches ({m}) to be a "
                                 f"multiple of the rounds ({rounds})")
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)
    fwd_bwd = m * v - warmup
    total = warmup + fwd_bwd + warmup

    def fwd_stage(op):
        return ((op // per_round) % v) * p + rank

    def bwd_stage(op):
        return (v - 1 - ((op - warmup) // per_round) % v) * p + rank

    nf: dict = {}
    nb: dict = {}
    out = []
    for op in range(total):
        if op < warmup + fwd_bwd:
            s = fwd_stage(op)
            out.append((s, "F", nf.get(s, 0)))
            nf[s] = nf.get(s, 0) + 1
        if op >= warmup:
            s = bwd_stage(op)
            out.append((s, "B", nb.get(s, 0)))
            nb[s] = nb.get(s, 0) + 1
    return out


def theoretical_bubble(n_ranks: int, microbatches: int, stages_per_rank: int = 1) -> float:
    """(p-1)/(v*m+p-1): the idle share of a pipeline step with equal stages and free p2p."""
    return (n_ranks - 1) / (stages_per_rank * microbatches + n_ranks - 1)


def send_waits(schedule: str, actions: list, n_stages: int) -> tuple[list, list]:
    """Which sends a rank waits for before each of its actions, and before the post-step work, in
    torch's schedules (a gloo send completes when the peer has received it): messages are
    ("F", stage, mb) (activations to stage + 1) and ("B", stage, mb) (gradients to stage - 1).
    GPipe waits for all forward sends before the first backward and for all backward sends at the
    end; 1F1B waits for each send after the next compute or in the fused send/recv before it
    (Schedule1F1B._step_microbatches); Interleaved1F1B waits for all sends at the end."""
    last = n_stages - 1
    before = [[] for _ in actions]
    post = []

    def msg(k, s, mb):
        return [(k, s, mb)] if (k == "F" and s < last) or (k == "B" and s > 0) else []

    if schedule == "gpipe":
        n_f = sum(k == "F" for _, k, _ in actions)
        for s, k, mb in actions:
            (before[n_f] if k == "F" else post).extend(msg(k, s, mb))
        return before, post
    if schedule != "1f1b":
        for s, k, mb in actions:
            post.extend(msg(k, s, mb))
        return before, post
    s = actions[0][0]
    w = next(i for i, (_, k, _) in enumerate(actions) if k == "B")   # warm-up forwards
    for i in range(1, w):              # after F_i: wait for the send of F_{i-1}
        before[i + 1].extend(msg("F", s, actions[i - 1][2]))
    j = w
    last_f = actions[w - 1][2]
    while j < len(actions):
        if actions[j][1] != "B":
            break
        before[j].extend(msg("F", s, last_f))            # fused with the recv of this backward
        if j + 1 < len(actions) and actions[j + 1][1] == "F":
            before[j + 1].extend(msg("B", s, actions[j][2]))  # fused with the recv of the next forward
            last_f = actions[j + 1][2]
            j += 2
            continue
        break
    pending = msg("B", s, actions[j][2])                 # the 1F1B phase's last backward send
    for q in range(j + 1, len(actions)):                 # cool-down: wait after the next backward
        (before[q + 1] if q + 1 < len(actions) else post).extend(pending)
        pending = msg("B", s, actions[q][2])
    post.extend(pending)
    return before, post
