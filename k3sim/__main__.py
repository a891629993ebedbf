"""`python -m k3sim` and the `k3sim` console script: start-up collections deferred before anything is imported
(`procs.defer_start_up_collections`), then the CLI."""

from k3sim import procs


def run() -> None:
    procs.defer_start_up_collections()
    from k3sim.cli import main

    main()


if __name__ == "__main__":
    run()
