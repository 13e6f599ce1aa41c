"""`llmkern --version`: the package version and what the installed build carries (the CUDA toolkit,
its machine-code and PTX architectures, the CPU SIMD levels), read from the extension."""
from __future__ import annotations

import argparse


def version_text() -> str:
    from .._build import build_info  # imported when asked: `llmkern --help` stays light

    info = build_info()
    lines = [f"llmkern {info['version']}"]
    if info["cuda_toolkit"]:
        lines.append(f"CUDA {info['cuda_toolkit']}: SASS sm_{{{info['cuda_sass']}}}, PTX compute_{{{info['cuda_ptx']}}}; "
                     f"{info['cuda_device_count']} GPU(s) visible")
    else:
        lines.append("CUDA: not built")
    lines.append(f"CPU: {', '.join(info['cpu_simd_compiled'])} (running {info['cpu_simd']}); "
                 f"threads: {', '.join(info['threads_compiled'])}")
    return "\n".join(lines)


class VersionAction(argparse.Action):
    """Like argparse's "version" action, with the text built only when the option is given."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()
