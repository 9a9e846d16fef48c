"""`ops/bench.py`'s result for a reader (without --json)."""

from __future__ import annotations

import argparse
from typing import Any


def print_result(result: dict[str, Any], a: argparse.Namespace) -> None:
    raw, kq, rss = result["raw"], result["kq"], result
    share, pipeline = result.get("share"), result.get("pipeline")
    print(f"messages {a.messages}, subscribers {a.subscribers}, paced rate {a.rate}/s")
    print(f"raw pass-through : {raw['msgs_per_s']:9.0f} msgs/s   p50 {raw['p50_ms']:7.1f} ms"
          f"   p99 {raw['p99_ms']:7.1f} ms")
    who = f"kq, {a.instances} instance(s)" if a.instances else "kq at-least-once"
    print(f"{who:17s}: {kq['msgs_per_s']:9.0f} msgs/s   p50 {kq['p50_ms']:7.1f} ms"
          f"   p99 {kq['p99_ms']:7.1f} ms")
    if share is not None:
        print(f"share groups     : {share['msgs_per_s']:9.0f} msgs/s   p50 "
              f"{share['p50_ms']:7.1f} ms   p99 {share['p99_ms']:7.1f} ms   (steady "
              f"{share['msgs_per_s_steady']:.0f} msgs/s; first record after "
              f"{share['first_delivery_s']:.1f} s)")
    print(f"ratio kq/raw     : {result['ratio_kq_to_raw']:.2f}")
    if share is not None:
        print(f"ratio kq/share   : {result['ratio_kq_to_share']:.2f} (to its steady rate "
              f"{result['ratio_kq_to_share_steady']:.2f})")
    print(f"CPU per message, whole machine (broker included): raw "
          f"{raw.get('machine_cpu_us_per_msg', float('nan')):.0f} us, kq "
          f"{kq.get('machine_cpu_us_per_msg', float('nan')):.0f} us (kq serve alone "
          f"{kq.get('service_cpu_us_per_msg', float('nan')):.0f} us)")
    paced_raw, paced_kq = raw.get("cpu_us_per_msg_paced", {}), kq.get("cpu_us_per_msg_paced", {})
    if paced_raw and paced_kq:
        print(f"at the paced rate: raw {paced_raw['machine']:.0f} us, kq "
              f"{paced_kq['machine']:.0f} us (kq serve alone {paced_kq['service']:.0f} us, "
              f"the relay {paced_raw['service']:.0f} us; broker {paced_kq['broker']:.0f} "
              f"against {paced_raw['broker']:.0f}, workers {paced_kq['subscribers']:.0f} "
              f"against {paced_raw['subscribers']:.0f})")
    slow_raw, slow_kq = raw.get("paced_hiccups"), kq.get("paced_hiccups")
    share_slow = (share or {}).get("paced_hiccups")
    if slow_raw and slow_kq:  # stretches in which every process ran slower: the p99's tail
        print("the machine slowed by itself during the paced runs (ops/hiccups.py): " + "; ".join(
            f"{kind} {s['stretches']:.0f} times, {s['slowed_ms']:.0f} ms in all, at worst "
            f"{s['worst_factor']:.0f}x" for kind, s in (("raw", slow_raw), ("kq", slow_kq),
                                                        ("share", share_slow)) if s)
            + f" (steal: raw {paced_raw.get('stolen', 0):.1f}, kq {paced_kq.get('stolen', 0):.1f}"
            " us per message)")
    gcs = [(kind, r.get("paced_broker_gc")) for kind, r in
           (("raw", raw), ("share", share or {}), ("kq", kq))]
    if any(gc for _, gc in gcs):  # the broker stopped by its collector: every system waits
        print("the broker's GC pauses during the paced runs (ops/broker_gc.py): " + "; ".join(
            f"{kind} {gc['pauses']:.0f}, {gc['paused_ms']:.0f} ms in all, the longest "
            f"{gc['longest_ms']:.0f} ms" for kind, gc in gcs if gc))
    kafka_raw, kafka_kq = raw.get("kafka_per_msg_paced", {}), kq.get("kafka_per_msg_paced", {})
    if kafka_raw and kafka_kq:
        print("Kafka requests per message at the paced rate: " + ", ".join(
            f"{role} {kafka_raw[role]['requests']:.3f} (raw) / "
            f"{kafka_kq[role]['requests']:.3f} (kq)" for role in ("service", "subscribers")))
    print(f"RSS per queued message: {rss['rss_bytes_per_queued_msg']:.0f} bytes "
          f"({rss['queued']} queued); restart with them queued ({rss['leased']} leased): "
          f"{rss['restart_s']:.1f} s")
    print(f"rebuild without data_dir: {rss['rebuild_s']:.1f} s, "
          f"{rss['rebuild_transitions_per_s']:.0f} journal transitions/s")
    print(f"browse: a new browser is shown them at {rss['browse_msgs_per_s']:.0f} msgs/s")
    if pipeline is not None:
        print(f"pipeline: kq journal report on local[2] read {pipeline['transitions']} "
              f"transitions in {pipeline['seconds']:.1f} s: "
              f"{pipeline['records_per_s']:.0f} transitions/s")

