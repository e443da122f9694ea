"""The server's counters and latency histograms, rendered in the Prometheus text format for GET /metrics.

Written from the scheduler thread and the HTTP side, read by /metrics: one lock. Gauges (queue depth, running
batch, KV slots in use, the softmax fallback rows) are read from the scheduler when /metrics renders; the
scheduler keeps them up to date between steps.
"""

from __future__ import annotations

import bisect
import threading

# seconds; TTFT spans queueing and prefill, the inter-token latency one decode step (plus its share of prefill)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
# seconds between two steps' tokens, for steps that ran back to back: a decode step, or a mixed one (with a chunk)
STEP_BUCKETS = (0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.04, 0.08, 0.16)
STEP_KINDS = ("decode", "mixed")
# prompt tokens one step prefilled (a paged engine's steps carry chunks of several prompts up to --prefill-budget)
PREFILL_BUCKETS = (0, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
OUTCOMES = ("answered", "refused", "cancelled", "timed_out", "failed")
PREFIX = "fdpp_"
# sizes, not counts: gauges, though named *_total like the counters (the name the dashboards and the issue use)
SIZE_GAUGES = ("kv_slots_total", "kv_blocks_total")


class Histogram:
    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def lines(self, name: str, labels: str = "") -> list[str]:
        """labels: e.g. 'kind="decode"', put in front of every sample's le."""
        out, running, first = [], 0, f"{labels}," if labels else ""
        tail = f"{{{labels}}}" if labels else ""
        for bound, count in zip(self.bounds, self.counts):
            running += count
            out.append(f'{name}_bucket{{{first}le="{bound}"}} {running}')
        running += self.counts[-1]
        out += [f'{name}_bucket{{{first}le="+Inf"}} {running}', f"{name}_sum{tail} {self.total:.6f}",
                f"{name}_count{tail} {running}"]
        return out


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = dict.fromkeys(OUTCOMES, 0)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.steps = {kind: Histogram(STEP_BUCKETS) for kind in STEP_KINDS}
        self.prefill = Histogram(PREFILL_BUCKETS)

    def request_done(self, outcome: str) -> None:
        with self.lock:
            self.requests[outcome] += 1

    def add_tokens(self, prompt: int = 0, generated: int = 0) -> None:
        with self.lock:
            self.prompt_tokens += prompt
            self.generation_tokens += generated

    def first_token(self, seconds: float) -> None:
        with self.lock:
            self.ttft.observe(seconds)

    def inter_token(self, seconds: float) -> None:
        with self.lock:
            self.itl.observe(seconds)

    def step(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.steps[kind].observe(seconds)

    def prefill_step(self, tokens: int) -> None:
        with self.lock:
            self.prefill.observe(tokens)

    def render(self, gauges: dict) -> str:
        """The text format. gauges: name -> (help, value, labels or None) from the scheduler."""
        with self.lock:
            lines = _header("requests_total", "counter", "requests finished, by outcome")
            lines += [f'{PREFIX}requests_total{{outcome="{k}"}} {v}' for k, v in self.requests.items()]
            lines += _header("prompt_tokens_total", "counter", "prompt tokens of admitted requests")
            lines.append(f"{PREFIX}prompt_tokens_total {self.prompt_tokens}")
            lines += _header("generation_tokens_total", "counter", "tokens generated (sent to clients)")
            lines.append(f"{PREFIX}generation_tokens_total {self.generation_tokens}")
            lines += _header("time_to_first_token_seconds", "histogram", "submission to first token")
            lines += self.ttft.lines(f"{PREFIX}time_to_first_token_seconds")
            lines += _header("inter_token_latency_seconds", "histogram", "time between a sequence's tokens")
            lines += self.itl.lines(f"{PREFIX}inter_token_latency_seconds")
            lines += _header("step_seconds", "histogram", "time of a step that ran right behind the one before, by "
                             "kind (mixed: a prompt chunk rode on the decode step)")
            for kind, histogram in self.steps.items():
                lines += histogram.lines(f"{PREFIX}step_seconds", f'kind="{kind}"')
            lines += _header("prefill_tokens_per_step", "histogram", "prompt tokens a step prefilled (paged engines; "
                             "the mean is _sum / _count)")
            lines += self.prefill.lines(f"{PREFIX}prefill_tokens_per_step")
        for name, (help_text, value, labels) in gauges.items():
            kind = "counter" if name.endswith("_total") and name not in SIZE_GAUGES else "gauge"
            lines += _header(name, kind, help_text)
            label_text = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
            lines.append(f"{PREFIX}{name}{label_text} {value}")
        return "\n".join(lines) + "\n"


def _header(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}"]


def parse(text: str) -> dict:
    """Prometheus text -> {sample name with its labels: value}, e.g. {'fdpp_kv_slots_in_use': 0.0} (for tests and
    the load generator)."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples
