"""The runs database: one SQLite file holding every optimiser sweep, its measurements and the
estimate made next to each measurement. `llmkern optimize` writes it; `llmkern explore` reads it.

Schema (version 2; later versions only add tables/columns, and `open_db` migrates older files):

    meta(key, value)                      'schema_version' -> '2'
    machines(id, key, cpu_model, cpu_cores, gpu, memory_gb, limits_json, notes, created_at)
        limits_json: measured limits, e.g. {"bandwidth_gbs": 12.3, "gemm_gflops": {"float32": 95.0},
        "attention_gflops": {...}, "calibrated": true}. `key` is the canonical JSON of cpu_model,
        cpu_cores, gpu, memory_gb and notes: one row per machine, holding the limits measured when
        it was first recorded (each estimate stores the rates it was made with).
    workloads(id, key, name, kind, spec_json, num_requests, created_at)
        kind: 'serve' (open-loop client against a server) or 'offline' (in-process LLM.generate).
    sweeps(id, started_at, finished_at, status, model, model_config_json, machine_id, workload_id,
           llmkern_version, sweep_spec, constraints, argv_json, notes, framework, framework_version)
        status: 'running' | 'done' | 'interrupted' | 'failed'. framework: the server swept
        ('llmkern', 'vllm', 'sglang'; version 2) and its version.
    configurations(id, key, knobs_json)
        knobs_json: {"max_num_seqs": 8, "speculative": "ngram:4", ...}; key = canonical_key(knobs).
    results(id, sweep_id, config_id, status, error, started_at, finished_at, serve_command)
        one row per (sweep, configuration); status 'ok' | 'failed'. Written in one transaction with
        its metrics and latencies, so an interrupted run leaves either all of it or nothing.
    metrics(result_id, source, name, value, unit)
        source 'measured', 'estimate' (made with the sweep's hardware profile), 'estimate:PROFILE'
        (the same requests estimated on other hardware, e.g. 'estimate:H100' from its datasheet) or
        'machine' (load over the run: load_1m_before, load_1m_after, foreign_cpu = CPU share of the
        machine used by processes outside the measured tree). Names (units): output_throughput (tok/s),
        total_throughput (tok/s, prompt + output), request_throughput (req/s), goodput (req/s),
        {ttft,itl,e2e_latency}_{mean,median,p95,p99} (s), requests, completed, failed, refused
        (count), duration (s). Estimates use the same names where they predict the same quantity,
        plus estimator-only names (prefill_step_time, decode_step_time, kv_max_concurrency, ...).
    latencies(result_id, idx, ok, ttft, e2e_latency, itl_mean, output_tokens, prompt_tokens, itls_json)
        one row per request (seconds; NULL where the request failed).

Timestamps are Unix seconds (REAL). Everything the read API returns is plain dicts/lists/numbers."""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from typing import Any, Dict, Iterator, List, Optional

SCHEMA_VERSION = 2

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS machines (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, cpu_model TEXT, cpu_cores INTEGER, gpu TEXT,
    memory_gb REAL, limits_json TEXT NOT NULL DEFAULT '{}', notes TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS workloads (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, name TEXT NOT NULL, kind TEXT NOT NULL,
    spec_json TEXT NOT NULL, num_requests INTEGER, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS sweeps (
    id INTEGER PRIMARY KEY, started_at REAL NOT NULL, finished_at REAL, status TEXT NOT NULL,
    model TEXT NOT NULL, model_config_json TEXT NOT NULL DEFAULT '{}',
    machine_id INTEGER NOT NULL REFERENCES machines(id), workload_id INTEGER NOT NULL REFERENCES workloads(id),
    llmkern_version TEXT NOT NULL, sweep_spec TEXT NOT NULL DEFAULT '', constraints TEXT NOT NULL DEFAULT '',
    argv_json TEXT NOT NULL DEFAULT '[]', notes TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS configurations (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, knobs_json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY, sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
    config_id INTEGER NOT NULL REFERENCES configurations(id), status TEXT NOT NULL, error TEXT,
    started_at REAL, finished_at REAL, serve_command TEXT NOT NULL DEFAULT '',
    UNIQUE (sweep_id, config_id));
CREATE TABLE IF NOT EXISTS metrics (
    result_id INTEGER NOT NULL REFERENCES results(id), source TEXT NOT NULL, name TEXT NOT NULL,
    value REAL, unit TEXT NOT NULL DEFAULT '', PRIMARY KEY (result_id, source, name));
CREATE TABLE IF NOT EXISTS latencies (
    result_id INTEGER NOT NULL REFERENCES results(id), idx INTEGER NOT NULL, ok INTEGER NOT NULL,
    ttft REAL, e2e_latency REAL, itl_mean REAL, output_tokens INTEGER, prompt_tokens INTEGER,
    itls_json TEXT, PRIMARY KEY (result_id, idx));
CREATE INDEX IF NOT EXISTS results_sweep ON results(sweep_id);
"""

_SCHEMA_V2 = """
ALTER TABLE sweeps ADD COLUMN framework TEXT NOT NULL DEFAULT 'llmkern';
ALTER TABLE sweeps ADD COLUMN framework_version TEXT NOT NULL DEFAULT '';
"""

# version -> SQL that brings a file at version-1 up to it (1 creates everything).
_MIGRATIONS = {1: _SCHEMA_V1, 2: _SCHEMA_V2}

UNITS = {"output_throughput": "tok/s", "total_throughput": "tok/s", "request_throughput": "req/s",
         "goodput": "req/s", "duration": "s", "requests": "count", "completed": "count", "failed": "count",
         "refused": "count"}


def metric_unit(name: str) -> str:
    """The unit the schema uses for a metric name ('s' for latencies and step times)."""
    if name in UNITS:
        return UNITS[name]
    if name.startswith(("ttft_", "itl_", "e2e_latency_")) or name.endswith("_time"):
        return "s"
    return ""


class SchemaError(RuntimeError):
    """The file is not a runs database this llmkern can read (e.g. written by a newer version)."""


def canonical_key(obj: Any) -> str:
    """Canonical JSON of a dict (sorted keys, no spaces): equal knob sets give equal keys."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def default_db_path() -> str:
    """The database shipped with the package (real runs measured on a CPU machine); read-only use."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "runs.sqlite")


def user_db_path() -> str:
    """Where `llmkern optimize` writes by default: $LLMKERN_DB, else ./llmkern-runs.sqlite."""
    return os.environ.get("LLMKERN_DB") or os.path.join(os.getcwd(), "llmkern-runs.sqlite")


def open_db(path: Optional[str] = None, readonly: bool = False) -> "RunsDB":
    """Open (creating or migrating unless readonly) a runs database. path None: the shipped one when
    readonly, else user_db_path(). Raises SchemaError for a newer or foreign file, FileNotFoundError
    for a missing file when readonly."""
    if path is None:
        path = default_db_path() if readonly else user_db_path()
    return RunsDB(path, readonly=readonly)


def _loads(s: Optional[str], default):
    return default if s is None or s == "" else json.loads(s)


class RunsDB:
    """A connection to one runs database. Use as a context manager or call close()."""

    def __init__(self, path: str, readonly: bool = False):
        self.path = path
        self.readonly = readonly
        if readonly:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"runs database {path!r} does not exist")
            uri = "file:" + os.path.abspath(path)
            try:
                self.conn = sqlite3.connect(uri + "?mode=ro", uri=True)
                self._version()
            except sqlite3.DatabaseError:
                # A WAL file in a read-only folder (e.g. an installed wheel) opens only as immutable.
                self.conn = sqlite3.connect(uri + "?immutable=1", uri=True)
        else:
            parent = os.path.dirname(os.path.abspath(path))
            os.makedirs(parent, exist_ok=True)
            self.conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
        self.conn.row_factory = sqlite3.Row
        try:
            self._init_schema()
        except Exception:
            self.conn.close()
            raise

    # -- schema ---------------------------------------------------------------------------------
    def _version(self) -> Optional[int]:
        try:
            has_meta = self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
        except sqlite3.DatabaseError as e:
            raise SchemaError(f"{self.path!r} is not an SQLite runs database: {e}") from e
        if not has_meta:
            tables = self.conn.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
            if tables:
                raise SchemaError(f"{self.path!r} is an SQLite file but not a llmkern runs database (no meta table)")
            return None
        row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            raise SchemaError(f"{self.path!r}: meta table has no schema_version")
        return int(row[0])

    def _init_schema(self) -> None:
        version = self._version()
        if version is not None and version > SCHEMA_VERSION:
            raise SchemaError(f"{self.path!r} has schema version {version}, newer than this llmkern reads "
                              f"({SCHEMA_VERSION}); upgrade llmkern to open it")
        if self.readonly:
            if version is None:
                raise SchemaError(f"{self.path!r} is empty, not a runs database")
            return
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        with self.transaction():
            self.conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            for v in range((version or 0) + 1, SCHEMA_VERSION + 1):
                for stmt in _MIGRATIONS[v].split(";"):
                    if stmt.strip():
                        self.conn.execute(stmt)
            self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
                              (str(SCHEMA_VERSION),))

    def _has_column(self, table: str, column: str) -> bool:
        return any(r[1] == column for r in self.conn.execute(f"PRAGMA table_info({table})"))

    @property
    def schema_version(self) -> int:
        return int(self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])

    @contextlib.contextmanager
    def transaction(self):
        """BEGIN IMMEDIATE ... COMMIT; rolled back on any exception (KeyboardInterrupt included)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def export_readonly(self, dst: str) -> None:
        """Write a compact single-file copy (rollback journal, not WAL) that opens from a read-only
        folder, e.g. the package data."""
        if os.path.exists(dst):
            os.remove(dst)
        self.conn.execute("VACUUM INTO ?", (dst,))
        c = sqlite3.connect(dst)
        c.execute("PRAGMA journal_mode=DELETE")
        c.close()

    # -- writes ---------------------------------------------------------------------------------
    def _get_or_insert(self, table: str, key: str, cols: Dict[str, Any]) -> int:
        row = self.conn.execute(f"SELECT id FROM {table} WHERE key=?", (key,)).fetchone()
        if row:
            return int(row[0])
        names = ["key"] + list(cols)
        cur = self.conn.execute(f"INSERT INTO {table}({','.join(names)}) VALUES ({','.join('?' * len(names))})",
                                [key] + list(cols.values()))
        return int(cur.lastrowid)

    def add_machine(self, cpu_model: str, cpu_cores: int, gpu: Optional[str] = None,
                    memory_gb: Optional[float] = None, limits: Optional[dict] = None, notes: str = "") -> int:
        """The id of the row for this machine (same CPU, cores, GPU, memory and notes), inserted with
        these limits if new; an existing row keeps the limits it was first recorded with."""
        mem = None if memory_gb is None else round(float(memory_gb), 1)
        desc = dict(cpu_model=cpu_model, cpu_cores=cpu_cores, gpu=gpu, memory_gb=mem, notes=notes)
        with self.transaction():
            return self._get_or_insert("machines", canonical_key(desc),
                                       dict(desc, limits_json=canonical_key(limits or {}), created_at=time.time()))

    def add_workload(self, name: str, kind: str, spec: dict, num_requests: Optional[int] = None) -> int:
        """The id of the workload row with this name, kind and spec (inserted if new)."""
        if kind not in ("serve", "offline"):
            raise ValueError(f"kind: expected 'serve' or 'offline', got {kind!r}")
        desc = dict(name=name, kind=kind, spec_json=canonical_key(spec), num_requests=num_requests)
        with self.transaction():
            return self._get_or_insert("workloads", canonical_key(desc), dict(desc, created_at=time.time()))

    def add_configuration(self, knobs: dict) -> int:
        """The id of the configuration with these knobs (inserted if new)."""
        key = canonical_key(knobs)
        with self.transaction():
            return self._get_or_insert("configurations", key, {"knobs_json": key})

    def start_sweep(self, model: str, machine_id: int, workload_id: int, llmkern_version: str,
                    sweep_spec: str = "", constraints: str = "", argv: Optional[List[str]] = None,
                    model_config: Optional[dict] = None, notes: str = "", framework: str = "llmkern",
                    framework_version: str = "") -> int:
        with self.transaction():
            cur = self.conn.execute(
                "INSERT INTO sweeps(started_at, status, model, model_config_json, machine_id, workload_id, "
                "llmkern_version, sweep_spec, constraints, argv_json, notes, framework, framework_version) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (time.time(), "running", model, canonical_key(model_config or {}), machine_id, workload_id,
                 llmkern_version, sweep_spec, constraints, json.dumps(argv or []), notes, framework,
                 framework_version))
            return int(cur.lastrowid)

    def finish_sweep(self, sweep_id: int, status: str = "done") -> None:
        with self.transaction():
            self.conn.execute("UPDATE sweeps SET status=?, finished_at=? WHERE id=?", (status, time.time(), sweep_id))

    def resume_sweep(self, sweep_id: int) -> None:
        """Mark a sweep running again (`--continue`)."""
        with self.transaction():
            self.conn.execute("UPDATE sweeps SET status='running', finished_at=NULL WHERE id=?", (sweep_id,))

    def latest_sweep(self, model: str, workload_id: int, sweep_spec: str,
                     framework: str = "llmkern") -> Optional[dict]:
        """The newest sweep of this framework with this model, workload and sweep grammar (what
        --continue resumes)."""
        row = self.conn.execute("SELECT * FROM sweeps WHERE model=? AND workload_id=? AND sweep_spec=? AND "
                                "framework=? ORDER BY id DESC LIMIT 1",
                                (model, workload_id, sweep_spec, framework)).fetchone()
        return None if row is None else self._sweep_dict(row)

    def finished_config_keys(self, sweep_id: int) -> set:
        """Canonical keys of the configurations that have a result row in this sweep."""
        rows = self.conn.execute("SELECT c.key FROM results r JOIN configurations c ON c.id=r.config_id "
                                 "WHERE r.sweep_id=?", (sweep_id,)).fetchall()
        return {r[0] for r in rows}

    def record_result(self, sweep_id: int, knobs: dict, status: str, metrics: Dict[str, Optional[float]],
                      estimate: Optional[Dict[str, Optional[float]]] = None,
                      latencies: Optional[List[dict]] = None, serve_command: str = "",
                      error: Optional[str] = None, started_at: Optional[float] = None,
                      machine_load: Optional[Dict[str, Optional[float]]] = None,
                      profile_estimates: Optional[Dict[str, Dict[str, Optional[float]]]] = None) -> int:
        """One configuration's outcome, all in one transaction. latencies: dicts with keys ok, ttft,
        e2e_latency, itl_mean, output_tokens, prompt_tokens, itls (list). machine_load: the load
        over the run (machine_load.LoadMeter). profile_estimates: {profile name: estimate} made for
        other hardware (e.g. a GPU's datasheet), stored as source 'estimate:NAME'. Returns the result id."""
        if status not in ("ok", "failed"):
            raise ValueError(f"status: expected 'ok' or 'failed', got {status!r}")
        key = canonical_key(knobs)
        with self.transaction():
            cid = self._get_or_insert("configurations", key, {"knobs_json": key})
            old = self.conn.execute("SELECT id FROM results WHERE sweep_id=? AND config_id=?",
                                    (sweep_id, cid)).fetchone()
            if old:   # a re-run replaces the earlier outcome with everything hanging off it
                for table in ("metrics", "latencies", "results"):
                    self.conn.execute(f"DELETE FROM {table} WHERE {'id' if table == 'results' else 'result_id'}=?",
                                      (old[0],))
            cur = self.conn.execute(
                "INSERT INTO results(sweep_id, config_id, status, error, started_at, finished_at, "
                "serve_command) VALUES (?,?,?,?,?,?,?)",
                (sweep_id, cid, status, error, started_at, time.time(), serve_command))
            rid = int(cur.lastrowid)
            rows = [(rid, "measured", k, v, metric_unit(k)) for k, v in (metrics or {}).items()]
            rows += [(rid, "estimate", k, v, metric_unit(k)) for k, v in (estimate or {}).items()]
            rows += [(rid, "machine", k, v, "") for k, v in (machine_load or {}).items()]
            for prof, est in (profile_estimates or {}).items():
                rows += [(rid, f"estimate:{prof}", k, v, metric_unit(k)) for k, v in est.items()]
            self.conn.executemany("INSERT INTO metrics(result_id, source, name, value, unit) VALUES (?,?,?,?,?)",
                                  [(a, s, n, None if v is None else float(v), u) for a, s, n, v, u in rows])
            self.conn.executemany(
                "INSERT INTO latencies(result_id, idx, ok, ttft, e2e_latency, itl_mean, output_tokens, "
                "prompt_tokens, itls_json) VALUES (?,?,?,?,?,?,?,?,?)",
                [(rid, i, int(bool(d.get("ok"))), d.get("ttft"), d.get("e2e_latency"), d.get("itl_mean"),
                  d.get("output_tokens"), d.get("prompt_tokens"),
                  None if d.get("itls") is None else json.dumps([round(x, 6) for x in d["itls"]]))
                 for i, d in enumerate(latencies or [])])
            return rid

    # -- reads (what the explorer uses) ----------------------------------------------------------
    def machines(self) -> List[dict]:
        """[{id, cpu_model, cpu_cores, gpu, memory_gb, limits: dict, notes, created_at}]"""
        out = []
        for r in self.conn.execute("SELECT * FROM machines ORDER BY id"):
            d = dict(r)
            d.pop("key")
            d["limits"] = _loads(d.pop("limits_json"), {})
            out.append(d)
        return out

    def workloads(self) -> List[dict]:
        """[{id, name, kind, spec: dict, num_requests, created_at}]"""
        out = []
        for r in self.conn.execute("SELECT * FROM workloads ORDER BY id"):
            d = dict(r)
            d.pop("key")
            d["spec"] = _loads(d.pop("spec_json"), {})
            out.append(d)
        return out

    @staticmethod
    def _sweep_dict(r) -> dict:
        d = dict(r)
        d["model_config"] = _loads(d.pop("model_config_json"), {})
        d["argv"] = _loads(d.pop("argv_json"), [])
        return d

    def sweeps(self) -> List[dict]:
        """[{id, started_at, finished_at, status, model, model_config: dict, machine_id, workload_id,
        llmkern_version, sweep_spec, constraints, argv: list, notes}]"""
        return [self._sweep_dict(r) for r in self.conn.execute("SELECT * FROM sweeps ORDER BY id")]

    def models(self) -> List[str]:
        return [r[0] for r in self.conn.execute("SELECT DISTINCT model FROM sweeps ORDER BY model")]

    def knob_names(self) -> List[str]:
        """Every knob name used by any configuration, sorted."""
        names = set()
        for (k,) in self.conn.execute("SELECT knobs_json FROM configurations"):
            names.update(json.loads(k))
        return sorted(names)

    def iter_results(self, model: Optional[str] = None, machine_id: Optional[int] = None,
                     workload_id: Optional[int] = None, sweep_id: Optional[int] = None,
                     status: Optional[str] = "ok", knobs: Optional[dict] = None) -> Iterator[dict]:
        """Results matching every given filter (None = any; knobs: each given knob equal), oldest
        first, each as {id, sweep_id, status, error, started_at, finished_at, serve_command, model,
        machine_id, workload_id, workload_name, workload_kind, llmkern_version, framework,
        framework_version, config_id, config_key, knobs: dict, metrics: {name: value},
        estimate: {name: value}, machine_load: {name: value}, profile_estimates: {profile: {name: value}}}."""
        where, args = [], []
        for col, val in (("s.model", model), ("s.machine_id", machine_id), ("s.workload_id", workload_id),
                         ("r.sweep_id", sweep_id), ("r.status", status)):
            if val is not None:
                where.append(f"{col}=?")
                args.append(val)
        # A version-1 file opened read-only (not migrated) has no framework columns: all llmkern.
        fw = ("s.framework, s.framework_version" if self._has_column("sweeps", "framework")
              else "'llmkern' AS framework, '' AS framework_version")
        sql = (f"SELECT r.*, s.model, s.machine_id, s.workload_id, s.llmkern_version, {fw}, "
               "w.name AS workload_name, "
               "w.kind AS workload_kind, c.key AS config_key, c.knobs_json FROM results r "
               "JOIN sweeps s ON s.id=r.sweep_id JOIN workloads w ON w.id=s.workload_id "
               "JOIN configurations c ON c.id=r.config_id"
               + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.id")
        for r in self.conn.execute(sql, args).fetchall():
            d = dict(r)
            d["knobs"] = json.loads(d.pop("knobs_json"))
            if knobs and any(d["knobs"].get(k) != v for k, v in knobs.items()):
                continue
            d["metrics"], d["estimate"], d["machine_load"], d["profile_estimates"] = {}, {}, {}, {}
            for m in self.conn.execute("SELECT source, name, value FROM metrics WHERE result_id=?", (d["id"],)):
                src = m["source"]
                if src.startswith("estimate:"):
                    d["profile_estimates"].setdefault(src[len("estimate:"):], {})[m["name"]] = m["value"]
                else:
                    into = {"measured": "metrics", "machine": "machine_load"}.get(src, "estimate")
                    d[into][m["name"]] = m["value"]
            yield d

    def latencies(self, result_id: int) -> List[dict]:
        """Per-request rows of one result: [{idx, ok: bool, ttft, e2e_latency, itl_mean,
        output_tokens, prompt_tokens, itls: list | None}] (seconds)."""
        out = []
        for r in self.conn.execute("SELECT * FROM latencies WHERE result_id=? ORDER BY idx", (result_id,)):
            d = dict(r)
            d.pop("result_id")
            d["ok"] = bool(d["ok"])
            d["itls"] = _loads(d.pop("itls_json"), None)
            out.append(d)
        return out


# Module-level shorthands over an open RunsDB (the explorer's calls).
def iter_results(db: RunsDB, **filters) -> Iterator[dict]:
    return db.iter_results(**filters)


def machines(db: RunsDB) -> List[dict]:
    return db.machines()


def workloads(db: RunsDB) -> List[dict]:
    return db.workloads()

