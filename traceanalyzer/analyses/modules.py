"""The SQL modules (``sql/<name>.sql``) and binding them into a connection, only as needed.

Each module is one concern and says in its header which modules it reads (Perfetto's
``INCLUDE PERFETTO MODULE`` is the model)::

    -- requires: activity, phases

:func:`bind` creates what a query needs -- the modules defining its views and, first, what those
require -- once per connection, and **materialises** each view into a temporary table as soon as it
is created. Why: DuckDB inlines a view into every query (and view) that reads it, so a chain of
50 views planned as one query costs seconds of planning and re-computes shared pieces -- more than
the whole work on a small run. Materialised, each view is planned against tables and computed
once. The tables hold the results for the parameters set when they were made (the connection's
DuckDB variables, recorded in ``_ta_bound``); when those change, :func:`bind` drops and re-makes
everything it made.

Scopes (:mod:`.summaries`): a line ``-- scope: rank`` in the comments just above a view says that
the view depends on one rank's data only (given the ``align`` views); ``-- scope: align`` marks the
cross-rank views that rank-local ones read (step alignment, clock offsets: computed from ``comms``
and ``steps``, never ``events``); ``-- scope: peers`` the rows of other ranks a rank view needs
(empty over a whole run; a map task provides them); a view without one is cross-rank. Views :func:`provide` put in a
connection (saved per-rank summaries) are not made again by :func:`bind`; once a rank view is
provided, the other rank views (read only by rank views) are not made either.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from . import pipeline_sweep, sweep

#: views made by a numpy twin of their SQL (the SQL stays the definition; the function may decline)
COMPUTED = {**sweep.COMPUTED, **pipeline_sweep.COMPUTED}

_REQUIRES_RE = re.compile(r"^-- requires: (.*)$", re.MULTILINE)
_DEFINES_RE = re.compile(r"CREATE OR REPLACE TEMP (?:VIEW|MACRO|TABLE)\s+(\w+)")
_VIEWS_RE = re.compile(r"CREATE OR REPLACE TEMP (?:VIEW|TABLE)\s+(\w+)")
_SCOPE_RE = re.compile(r"^-- scope: (\w+)\n(?:--[^\n]*\n)*CREATE OR REPLACE TEMP (?:VIEW|TABLE)\s+(\w+)", re.MULTILINE)
#: the scopes a view may declare (``-- scope: NAME``); undeclared views are cross-rank. ``peers``: rows
#: of other ranks a rank view needs besides its own (the sends that fed its receives): empty over a
#: whole run, provided by a map task for the ranks outside its chunk (:mod:`.summaries`)
SCOPES = ("rank", "align", "peers")


@dataclass(frozen=True)
class Module:
    """One SQL module: its name, the modules it reads, the views and macros it defines, its text,
    and the declared scope of its views ((view, scope) pairs, ``-- scope:`` lines)."""
    name: str
    requires: tuple[str, ...]
    defines: tuple[str, ...]
    text: str
    scopes: tuple[tuple[str, str], ...] = ()

    @property
    def views(self) -> list[str]:
        """The views (not macros) it defines."""
        return _VIEWS_RE.findall(self.text)


def _module(name: str, text: str) -> Module:
    m = _REQUIRES_RE.search(text)
    requires = tuple(r.strip() for r in m.group(1).split(",")) if m and not m.group(1).startswith("(") else ()
    scopes = tuple((view, scope) for scope, view in _SCOPE_RE.findall(text))
    bad = [f"{v}: {sc}" for v, sc in scopes if sc not in SCOPES]
    if bad:
        raise ValueError(f"SQL module {name}: unknown scope ({', '.join(bad)}); scopes: {', '.join(SCOPES)}")
    return Module(name, requires, tuple(_DEFINES_RE.findall(text)), text, scopes)


def scoped(scope: str) -> list[str]:
    """The views declaring ``-- scope: <scope>``, in binding order of their modules."""
    mods = modules()
    return [v for m in closure(sorted(mods)) for v, sc in mods[m].scopes if sc == scope]


#: SQL modules added from outside the package (:func:`add`, an analysis registered with its own file)
_EXTRA: dict[str, Module] = {}


@lru_cache(maxsize=None)
def modules() -> dict[str, Module]:
    """Every SQL module by name: the package's (read once per process) and the added ones."""
    out = {}
    for entry in sorted(resources.files(__package__).joinpath("sql").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            out[entry.name[:-4]] = _module(entry.name[:-4], entry.read_text())
    return {**out, **_EXTRA}


def add(path) -> Module:
    """Add the SQL module in file ``path`` (named after the file); its ``-- requires:`` line names
    the package's modules it reads."""
    from pathlib import Path
    path = Path(path)
    name = path.stem
    if name in modules() and name not in _EXTRA:
        raise ValueError(f"{path}: an SQL module {name!r} exists already")
    _EXTRA[name] = _module(name, path.read_text())
    modules.cache_clear()
    owner.cache_clear()
    _scope_map.cache_clear()
    return _EXTRA[name]


def remove(name: str) -> None:
    """Remove a module :func:`add` added."""
    _EXTRA.pop(name, None)
    modules.cache_clear()
    owner.cache_clear()
    _scope_map.cache_clear()


@lru_cache(maxsize=None)
def owner() -> dict[str, str]:
    """View or macro name -> the module that defines it."""
    return {view: m.name for m in modules().values() for view in m.defines}


def closure(names, provided=frozenset()) -> list[str]:
    """``names`` (modules) with everything they require, each after what it reads; a module whose
    views are all ``provided`` (:func:`provide`) is left out with what it requires."""
    mods, order, seen = modules(), [], set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in seen:
            return
        if name not in mods:
            raise KeyError(f"unknown SQL module {name!r} (required by {' -> '.join(path) or 'the caller'})")
        if name in path:
            raise ValueError(f"SQL modules require each other: {' -> '.join(path + (name,))}")
        views = mods[name].views
        if provided and views and all(v in provided for v in views):
            seen.add(name)
            return
        for dep in mods[name].requires:
            visit(dep, path + (name,))
        seen.add(name)
        order.append(name)
    for name in names:
        visit(name, ())
    return order


@lru_cache(maxsize=None)
def _scope_map() -> dict[str, str]:
    return {v: sc for m in modules().values() for v, sc in m.scopes}


def scope_of(view: str) -> str | None:
    """The scope ``view`` declares (``-- scope:``), None for a cross-rank view."""
    return _scope_map().get(view)


def modules_for(views) -> list[str]:
    """The modules (in binding order) that a query of ``views`` needs."""
    own = owner()
    unknown = [v for v in views if v not in own]
    if unknown:
        raise KeyError(f"no SQL module defines {', '.join(unknown)}")
    return closure(dict.fromkeys(own[v] for v in views))


def _variables(con) -> str:
    """The connection's DuckDB variables (the analyses' parameters) as one comparable text."""
    rows = con.execute("SELECT name, CAST(value AS VARCHAR) FROM duckdb_variables() ORDER BY name").fetchall()
    return json.dumps(rows)


def bound(con) -> set[str]:
    """The modules ``con`` holds, made with its current variables (an empty set when they changed;
    views provided for other variables are dropped then too)."""
    con.execute("CREATE TEMP TABLE IF NOT EXISTS _ta_bound (module VARCHAR, variables VARCHAR)")
    rows = con.execute("SELECT module, variables FROM _ta_bound").fetchall()
    now = _variables(con)
    stale = [v for v, var in _provided_rows(con) if var != now]
    if any(v != now for _, v in rows) or stale:
        _drop(con, [m for m, _ in rows])
        for view in stale:
            con.execute(f"DROP VIEW IF EXISTS {view}")
        con.execute("DELETE FROM _ta_provided WHERE variables <> ?", [now])
        return set()
    return {m for m, _ in rows}


def _provided_rows(con) -> list[tuple[str, str]]:
    con.execute("CREATE TEMP TABLE IF NOT EXISTS _ta_provided (view VARCHAR, variables VARCHAR)")
    return con.execute("SELECT view, variables FROM _ta_provided").fetchall()


def provide(con, view: str, select: str) -> None:
    """Make ``view`` in ``con`` as ``select`` (e.g. over saved per-rank summaries) for the current
    variables: :func:`bind` then reads it instead of computing it (until the variables change)."""
    _provided_rows(con)
    con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS {select}")
    con.execute("DELETE FROM _ta_provided WHERE view = ?", [view])
    con.execute("INSERT INTO _ta_provided VALUES (?, ?)", [view, _variables(con)])


def select_of(view: str) -> str:
    """The SELECT that defines ``view`` in its module (the statement after ``... VIEW view AS``)."""
    import duckdb
    con = duckdb.connect()
    try:
        for statement in con.extract_statements(modules()[owner()[view]].text):
            m = _AS_TABLE_RE.search(statement.query)
            if m and m.group(1) == view and _VIEW_RE.match(statement.query):
                return statement.query[m.end():].strip().rstrip(";")
    finally:
        con.close()
    raise KeyError(view)


def provided(con) -> set[str]:
    """The views :func:`provide` put in ``con`` (for its current variables)."""
    now = _variables(con)
    return {v for v, var in _provided_rows(con) if var == now}


def _drop(con, names) -> None:
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
    views = {v for (v,) in con.execute("SELECT view_name FROM duckdb_views() WHERE temporary").fetchall()}
    for name in reversed(closure(names)):
        for obj in reversed(modules()[name].defines):
            if obj in tables:
                con.execute(f"DROP TABLE {obj}")
            elif obj in views:
                con.execute(f"DROP VIEW {obj}")
            else:
                con.execute(f"DROP MACRO TABLE IF EXISTS {obj}")
    con.execute("DELETE FROM _ta_bound")


def bind(con, names, scopes=None) -> list[str]:
    """Make the views of modules ``names`` (and of what they require) in ``con``, each as a
    temporary table, unless it holds them for its current variables; returns the modules made now.
    With ``scopes`` (a map task of :mod:`.summaries`: ``("rank",)``) only the views declaring one
    of them are made: a module's cross-rank views, computed over one chunk of ranks, would be
    thrown away (the reduce makes them over all ranks); the connection is then only good for those."""
    have = bound(con)
    given = provided(con)
    rank = {v for v, sc in _scope_map().items() if sc == "rank"}
    if given & rank:  # a reduce: the rank views not provided are read by rank views only (summaries)
        given = given | rank | {v for v, sc in _scope_map().items() if sc == "peers"}
    todo = [m for m in closure(names, given) if m not in have]
    variables = _variables(con)
    for name in todo:
        for statement in con.extract_statements(modules()[name].text):
            m = _VIEW_RE.match(statement.query)
            if m and m.group(1) in given:
                continue  # provided (or only read by provided views): read, not computed
            if m and scopes is not None and scope_of(m.group(1)) not in scopes:
                continue  # not wanted here (a map task: cross-rank views)
            make(con, statement, m.group(1) if m else None, name)
        con.execute("INSERT INTO _ta_bound VALUES (?, ?)", [name, variables])
    return todo


def make(con, statement, view: str | None, module: str) -> None:
    """Run one statement of SQL module ``module`` in ``con``: a view (``view``) is made as a
    temporary table, by its numpy twin where it has one (the profilers of ``benchmarks/`` time
    this function)."""
    if view is not None and view in COMPUTED and COMPUTED[view](con):
        return  # made by its numpy twin (sweep.py; the SQL is its definition)
    table, made = _AS_TABLE_RE.subn(r"CREATE OR REPLACE TEMP TABLE \1 AS", statement.query, count=1)
    if view is not None and made:  # made as a table at once: one bind and one run (a view first is one bind more)
        con.execute(table)
        return
    con.execute(statement)
    if view is not None:
        _materialise(con, view)


_VIEW_RE = re.compile(r"\s*(?:--[^\n]*\n\s*)*CREATE OR REPLACE TEMP VIEW\s+(\w+)")
_AS_TABLE_RE = re.compile(r"CREATE OR REPLACE TEMP VIEW\s+(\w+)\s+AS\b")


def _materialise(con, view: str) -> None:
    """Replace the view by a table of its rows (same name, same columns)."""
    con.execute(f"CREATE TEMP TABLE _ta_rows AS SELECT * FROM {view}")
    con.execute(f"DROP VIEW {view}")
    con.execute(f"ALTER TABLE _ta_rows RENAME TO {view}")
