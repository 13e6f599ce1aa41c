"""The Performance Explorer as a section of the benchmark report (`llmkern bench`)."""
from __future__ import annotations

import os
from typing import Callable, List, Optional, Tuple

EXPLORER_PNG = "explorer.png"


def explorer_section(db_path: Optional[str]) -> Optional[Callable[[str], Tuple[List[str], List[str]]]]:
    """For bench.report.write_report(extra=...): a section with a screenshot of the Performance
    Explorer over the runs database db_path (taken with headless Chromium into the report's
    folder), or a note saying why there is none. None without a database."""
    if not db_path:
        return None

    def section(out_dir: str) -> Tuple[List[str], List[str]]:
        lines = ["", "## Performance Explorer", ""]
        png = os.path.join(out_dir, EXPLORER_PNG)
        try:
            from .cli import screenshot_db  # plotly and Chromium only when a report asks for it

            n = screenshot_db(db_path, png)
        except Exception as e:  # no Chromium, no plotly, an unreadable database: the report still renders
            return lines + [f"- no screenshot of the explorer over `{os.path.basename(db_path)}`: {e}"], []
        return lines + [f"`llmkern explore --db {os.path.basename(db_path)}`: {n} optimiser runs "
                        "(Pareto fronts, estimate vs measured, compared configurations).", "",
                        f"![Performance Explorer]({EXPLORER_PNG})"], [png]
    return section
