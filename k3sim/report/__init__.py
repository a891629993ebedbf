"""Planning reports: Markdown + HTML (jinja2 templates) with matplotlib figures, written whole through
`k3sim.files.output_dir` (kind `plan`)."""

from k3sim.report.render import check_out_dir, write_report

__all__ = ["check_out_dir", "write_report"]
