"""Benchmark: the CPU tracing adds to one credit award, measured in-process, and the cost of one bare SDK span.

Where bench_credits.py measures whole workers (broker, kombu, acks and all), this runs the award the way a worker
does, through Celery's own task tracer (signals, so the Celery instrumentation, and the credits database), in a
child process per variant, and reads the child's CPU time (every thread: the batch export thread's serialization
and HTTP posts included, flushed before the clock stops). Variants alternate within each round; spans are exported
over OTLP/HTTP to a sink in this (parent) process, whose CPU is not counted.

    export CREDITS_DATABASE_URL=mysql://root:@127.0.0.1:3306/creditshop_bench_credits
    DJANGO_DEBUG=false python bench/bench_tracing.py --awards 2000 --rounds 5
    DJANGO_DEBUG=false python bench/bench_tracing.py --awards 2000 --profile on     # cProfile of one variant
    DJANGO_DEBUG=false python bench/bench_tracing.py --awards 2000 --other-dir /tmp/before  # older code's too
    python bench/bench_tracing.py --spans 20000 --rounds 5                          # the bare span floor

The award rows it writes (order ids from 9e15 up, users 9e15 + 0..49) are deleted after each run.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from bench.common import OtlpSink  # noqa: E402

FIRST_ID = 9 * 10**15
USERS = 50
# "ON": export to the sink, every trace sampled (but on-unsampled); on-nosql: no statement spans (TRACING_SQL_SPANS).
VARIANTS = {
    "off": {},
    "on": {"ON": "1"},
    "on-nosql": {"ON": "1", "TRACING_SQL_SPANS": "false"},
    # Tracing on, every trace sampled out (as 90% of them are at OTEL_TRACES_SAMPLER_ARG=0.1): nothing recorded.
    "on-unsampled": {"ON": "1", "OTEL_TRACES_SAMPLER": "always_off"},
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--awards", type=int, default=2000, help="awards measured per run (after a warm-up)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    parser.add_argument("--spans", type=int, default=0, help="measure bare SDK spans instead of awards")
    parser.add_argument("--profile", metavar="VARIANT", help="run VARIANT once under cProfile and print the top")
    parser.add_argument(
        "--other-dir",
        type=Path,
        action="append",
        default=[],
        help="another checkout (with this file copied into its bench/): adds its variants but off to each round;"
        " repeatable",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.child:
        return child(args)
    sink = OtlpSink()
    names = args.variants.split(",")
    names += [f"{other}: {name}" for other in args.other_dir for name in names if name != "off"]
    if args.spans:
        names = list(SPAN_VARIANTS)
    if args.profile:
        names, args.rounds = [args.profile], 1
    results: dict[str, list[dict]] = {name: [] for name in names}
    try:
        for round_number in range(1, args.rounds + 1):
            for name in names:
                result = run_child(args, name, sink)
                results[name].append(result)
                print(f"round {round_number} | {name} | {format_result(result)}", flush=True)
    finally:
        sink.close()
    print()
    for name, runs in results.items():
        values = sorted(r["cpu_us"] for r in runs)
        print(f"{name}: median {values[len(values) // 2]:.1f} us CPU per item, range {values[0]:.1f}-{values[-1]:.1f}")
    if not args.spans and "off" in results:
        off = sorted(r["cpu_us"] for r in results["off"])[len(results["off"]) // 2]
        for name, runs in results.items():
            ratios = [r["cpu_us"] / o["cpu_us"] for r, o in zip(runs, results["off"], strict=True)]
            print(f"{name} / off, per round: " + ", ".join(f"{ratio:.3f}" for ratio in ratios))
        print(f"(off median {off:.1f} us)")
    print(f"load average: {os.getloadavg()}; sink: {sink.requests} OTLP requests, {sink.bytes:,} bytes")
    return 0


def format_result(result: dict) -> str:
    text = f"{result['cpu_us']:.1f} us CPU per item"
    if "main_us" in result:
        text += f" ({result['main_us']:.1f} in the task's thread, the rest in the export thread;"
        text += f" garbage collector {result['gc_us']:.1f})"
    if "spans" in result:
        text += f", {result['spans'] / result['items']:.2f} spans per item"
    return text


def run_child(args: argparse.Namespace, name: str, sink: OtlpSink) -> dict:
    env = {**os.environ}
    for key in list(env):
        if key.startswith("OTEL_"):
            del env[key]
    script = Path(__file__)
    if ": " in name:
        other, name = name.split(": ")
        script = Path(other) / "bench" / script.name
    variant = (SPAN_VARIANTS if args.spans else VARIANTS)[name]
    if variant.get("ON"):
        env.update(sink.env())
    env.update({k: v for k, v in variant.items() if k != "ON"})
    command = [sys.executable, str(script), "--child", name, "--awards", str(args.awards), "--spans", str(args.spans)]
    if args.profile:
        command += ["--profile", name]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stdout}\n{done.stderr}")
    if args.profile:
        print(done.stdout)
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- in the child --------------------------------------------------------------------------------------------------


def child(args: argparse.Namespace) -> int:
    if args.spans:
        return span_child(args)
    import logging

    import django

    django.setup()
    logging.disable(logging.INFO)  # as bench_credits.py runs its workers (--loglevel WARNING)
    from celery.app.trace import trace_task_ret

    from config.celery import app
    from core import tracing
    from core.celery_spans import celery_spans_install
    from core.contract import AWARD_CREDITS_TASK, CREATED_AT_HEADER, SCHEMA_VERSION
    from core.worker import _sql_spans

    app.loader.import_default_modules()  # the tasks, as a worker imports them at start
    tracing.tracing_setup(service_name="creditshop-worker", instrument=[celery_spans_install], sql=_sql_spans())
    counter = span_counter_install() if tracing.tracing_enabled() else None
    task_name = AWARD_CREDITS_TASK

    def award(order_id: int) -> None:
        transaction_id = uuid.uuid4().hex
        payload = {
            "schema_version": SCHEMA_VERSION,
            "transaction_id": transaction_id,
            "order_id": order_id,
            "user_id": FIRST_ID + order_id % USERS,
            "total": 1 + order_id % 100,
        }
        # The message's headers and delivery info as a worker's Request hands them to the task tracer.
        request = {
            "lang": "py",
            "task": task_name,
            "id": transaction_id,
            "root_id": transaction_id,
            "parent_id": None,
            "group": None,
            "retries": 0,
            "timelimit": [None, None],
            "eta": None,
            "expires": None,
            "argsrepr": "()",
            "kwargsrepr": repr({"message": payload}),
            "origin": "gen1@relay",
            "ignore_result": False,
            "traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
            CREATED_AT_HEADER: time.time(),
            "reply_to": str(uuid.uuid4()),
            "correlation_id": transaction_id,
            "delivery_info": {"exchange": "credits", "routing_key": "credits", "priority": 0, "redelivered": False},
        }
        embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
        result = trace_task_ret(
            task_name, transaction_id, request, ((), {"message": payload}, embed), None, None, app=app
        )
        if "awarded" not in repr(result):
            raise SystemExit(f"award {order_id} did not succeed: {result!r}")

    first = FIRST_ID + int(time.time() * 1000) % 10**9 * 10**4
    warm_up = max(100, args.awards // 10)
    try:
        for i in range(warm_up):  # connections, balance rows, caches
            award(first + i)
        flush()
        spans_before = counter.count if counter else 0
        gc_time = gc_clock()
        measure = profile_start(args)
        started, thread_started = time.process_time(), time.thread_time()
        for i in range(warm_up, warm_up + args.awards):
            award(first + i)
        main_thread = time.thread_time() - thread_started
        flush()
        cpu = time.process_time() - started
        profile_stop(measure)
    finally:
        from django.db import connections

        with connections["credits"].cursor() as cursor:
            cursor.execute("DELETE FROM order_credits WHERE order_id >= %s", [first])
    result = {
        "cpu_us": cpu / args.awards * 1e6,
        "main_us": main_thread / args.awards * 1e6,
        "gc_us": gc_time() / args.awards * 1e6,
        "items": args.awards,
    }
    if counter:
        result["spans"] = counter.count - spans_before
    print(json.dumps(result))
    return 0


def gc_clock():
    """Start timing the garbage collector's passes; return a function giving the seconds they took so far."""
    total = [0.0, 0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            total[1] = time.perf_counter()
        else:
            total[0] += time.perf_counter() - total[1]

    gc.callbacks.append(callback)
    return lambda: total[0]


def flush() -> None:
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if hasattr(provider, "force_flush"):
        provider.force_flush()


def span_counter_install():
    """Count ended spans in this process (cheap next to a span), to report spans per award."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor

    class Counter(SpanProcessor):
        count = 0

        def on_end(self, span) -> None:
            Counter.count += 1

    counter = Counter()
    trace.get_tracer_provider().add_span_processor(counter)
    return counter


def profile_start(args: argparse.Namespace):
    if not args.profile:
        return None
    import cProfile

    # This thread's CPU, not the wall clock: on a shared machine waiting is most of the wall time.
    profile = cProfile.Profile(time.thread_time)
    profile.enable()
    return profile


def profile_stop(profile) -> None:
    if profile is None:
        return
    import pstats

    profile.disable()
    stats = pstats.Stats(profile, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(40)


# The bare span: what one span costs the SDK, with nothing of the application around it.
SPAN_VARIANTS = {
    "span, no processor": {"PROCESSOR": "none"},
    "span + BatchSpanProcessor, exporter dropping": {"PROCESSOR": "drop"},
    "span + BatchSpanProcessor + OTLP/HTTP export": {"ON": "1", "PROCESSOR": "otlp"},
    # As in an award: each span around a database round trip, which leaves the CPU's caches to other processes.
    "SELECT 1 on the credits database, no span": {"PROCESSOR": "none", "SELECT": "1", "NO_SPAN": "1"},
    "SELECT 1 in a span + BatchSpanProcessor + OTLP/HTTP export": {"ON": "1", "PROCESSOR": "otlp", "SELECT": "1"},
}


def span_child(args: argparse.Namespace) -> int:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace import SpanKind

    class Dropping(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    processor = os.environ.get("PROCESSOR")
    if processor == "drop":
        provider.add_span_processor(BatchSpanProcessor(Dropping()))
    elif processor == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    tracer = provider.get_tracer("bench")
    # Like an award's SQL span: a child of a current span, a client kind, four short attributes.
    attributes = {
        "db.system": "mysql",
        "db.name": "creditshop_credits",
        "db.statement": "UPDATE credit_balances SET balance = balance + %s, updated_at = %s WHERE user_id = %s",
        "net.peer.name": "127.0.0.1",
    }

    work = lambda: None  # noqa: E731
    no_span = bool(os.environ.get("NO_SPAN"))
    if os.environ.get("SELECT"):
        import django

        django.setup()
        from django.db import connections

        cursor = connections["credits"].cursor()
        work = lambda: cursor.execute("SELECT 1")  # noqa: E731

    def spans(n: int) -> None:
        with tracer.start_as_current_span("parent"):
            for _ in range(n):
                if no_span:
                    work()
                    continue
                with tracer.start_as_current_span("UPDATE", kind=SpanKind.CLIENT, attributes=attributes):
                    work()

    spans(2000)
    provider.force_flush()
    measure = profile_start(args)
    started = time.process_time()
    spans(args.spans)
    provider.force_flush()
    cpu = time.process_time() - started
    profile_stop(measure)
    print(json.dumps({"cpu_us": cpu / args.spans * 1e6, "items": args.spans}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
