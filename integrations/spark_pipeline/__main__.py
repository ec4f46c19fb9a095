"""``python -m integrations.spark_pipeline``: run the feed and the outcome count until
interrupted (see the package docstring)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from integrations.spark_pipeline.pipeline import start_feed, start_outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integrations.spark_pipeline")
    parser.add_argument("--url", default=os.environ.get("OBJQ_URL"), help="store ($OBJQ_URL)")
    parser.add_argument("--inbox", required=True, help="folder where JSON files land")
    parser.add_argument("--out", required=True, help="the Parquet table of outcomes")
    parser.add_argument("--checkpoints", help="checkpoint folder (default: OUT/_checkpoints)")
    parser.add_argument("--trigger", default="1 second", help="micro-batch interval")
    args = parser.parse_args(argv)
    if not args.url:
        parser.error("no store: pass --url or set $OBJQ_URL")
    from objq_broker.spark import local_session

    checkpoints = Path(args.checkpoints or Path(args.out) / "_checkpoints")
    spark = local_session(app_name="objq-pipeline")
    Path(args.inbox).mkdir(parents=True, exist_ok=True)
    start_feed(spark, args.url, args.inbox, str(checkpoints / "feed"), trigger=args.trigger)
    start_outcomes(spark, args.url, args.out, str(checkpoints / "outcomes"), trigger=args.trigger)
    print(f"watching {args.inbox}; outcomes per minute in {args.out} (Ctrl-C stops)")
    try:
        spark.streams.awaitAnyTermination()
    except KeyboardInterrupt:
        for query in spark.streams.active:
            query.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
