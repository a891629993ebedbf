"""The prefix-cache replay forms its batches through the serving scheduler (issue 20 item 4: one scheduler)."""

from pathlib import Path

from k3sim.prefix_cache.config import CacheConfig
from k3sim.serving import scheduler
from k3sim.serving.replay import SchedulerConfig, StepCost, replay
from k3sim.workloads import read_mooncake

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
MLA_B, KDA_B = 27648, 449372160


def test_every_replay_step_is_a_batch_of_the_serving_scheduler(monkeypatch):
    """Each scheduling pass of the replay calls `scheduler.form_batch` (the engine's), and the chunks it prices
    are that plan's prefills: counting the calls and the prefill tokens they scheduled reproduces the replay's
    own totals (every prompt token is either a cache hit or scheduled by form_batch)."""
    calls, scheduled = [], []
    real = scheduler.form_batch

    def counting(rep):
        plan = real(rep)
        calls.append(len(plan.decoders))
        scheduled.append(sum(n for _, n, _ in plan.prefills))
        return plan

    monkeypatch.setattr(scheduler, "form_batch", counting)
    cfg = CacheConfig("decoupled", 512, 1024, MLA_B, KDA_B, 3, 40 * 1024 * MLA_B)
    res = replay(read_mooncake(TRACES / "conversation_head300.jsonl"), cfg, SchedulerConfig(2048, 16),
                 StepCost(tokens_per_s=2e4))
    assert calls and res.steps >= len(calls)  # a decode-only stretch is one pass of several steps
    assert sum(scheduled) == res.input_tokens - res.prefill_tokens_saved
    assert max(calls) <= 16  # max_running is the scheduler's max_batch
