"""Planning reports: Markdown + HTML (jinja2 templates) with matplotlib figures, written atomically."""

from k3sim.report.render import atomic_dir, check_out_dir, write_report

__all__ = ["atomic_dir", "check_out_dir", "write_report"]
