"""`python -m rollout.view <run dir> [--out DIR] [--chunk-steps N] [--serve [--port P]]`."""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import sys
from pathlib import Path

from rollout.view.export import build_viewer


def serve(root: Path, page: str, port: int) -> None:
    """Serve `root` on 127.0.0.1 until Ctrl-C (the viewer opens from disk too; this is for a remote machine through
    an SSH tunnel, or a browser that will not open file:// pages)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        print(f"serving {root} at http://127.0.0.1:{httpd.server_address[1]}/{page} (Ctrl-C stops)", flush=True)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rollout.view", description=__doc__)
    p.add_argument("run_dir", type=Path, help="a run directory (outputs/<run>)")
    p.add_argument("--out", type=Path, default=None, help="where the viewer goes (default: <run dir>/viewer)")
    p.add_argument("--chunk-steps", type=int, default=250, help="steps per data chunk loaded on demand")
    p.add_argument("--serve", action="store_true", help="also serve it on http://127.0.0.1:<port>/")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    try:
        built = build_viewer(args.run_dir, args.out, args.chunk_steps)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    skipped = f"; lines that did not parse: {built.skipped_lines}" if built.skipped_lines else ""
    print(f"viewer: {built.out_dir / 'index.html'} ({built.episodes} episodes, {built.steps} steps in "
          f"{built.chunks} chunks, {built.data_bytes / 1e6:.1f} MB, built in {built.seconds:.1f} s){skipped}")
    if args.serve:
        # the run directory is the root, so the screenshots the steps point at are served too
        root = Path(os.path.commonpath([args.run_dir.resolve(), built.out_dir.resolve()]))
        serve(root, f"{built.out_dir.resolve().relative_to(root)}/index.html", args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
