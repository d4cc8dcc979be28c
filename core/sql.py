"""Plain-SQL statements for the hot paths, built from the models' metadata, and the instances they wrote.

Why plain SQL: the order request and the credit award are the two paths whose CPU cost sets throughput, and the ORM
spends more CPU building and compiling their statements than the database spends running them (docs/PERFORMANCE.md
gives the figures), while the consumer shares its cores with MariaDB and RabbitMQ. (accounts/authentication.py does
the same for the token look-up.) The statements run as one batch per round trip through core/sql_batches.py (one
statement per round trip on a Galera node: Transaction says why).

Why from ``_meta``: a statement typed by hand drifts from its model without a sound. Here the table and every column
come from the model (``db_table``, each field's ``column``, quoted by the database's ``quote_name``), built on first
use and then kept for the life of the process: a call costs what the hand-typed string did. A column an INSERT does
not write must be one the database fills the way the ORM would (a ``db_default``, NULL for a nullable field without
a default, or the auto-increment key); building the statement fails otherwise, and tests/test_hot_path_sql.py builds
every hot-path statement and checks it against its model. Instances come from ``Model.from_db``, as if read back.
"""

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.db import connections, router
from django.db.models import Field, IntegerField, Model, Value

# What the driver escapes in a quoted value besides the quote itself, and a None written as text by %s. Searched
# for one at a time: plain substring searches are far cheaper on a large batch than one regular expression with
# these alternatives.
_NEEDS_ESCAPING = ("\\", "\x00", "\n", "\r", "\x1a", "'None'")


def _field(model: type[Model], name: str) -> Field:
    field = model._meta.get_field(name)
    if not field.concrete:
        raise ValueError(f"{model.__name__}.{name} has no column")
    return field


def _quote_name(model: type[Model]):
    return connections[router.db_for_write(model)].ops.quote_name


def _database_value(field: Field) -> tuple[bool, Any]:
    """Return whether the database fills this column by itself as the ORM would write it, and with what value."""
    if field is field.model._meta.auto_field:
        return True, None
    if field.has_db_default():
        value = field.db_default
        if isinstance(value, Value):
            value = value.value
        elif hasattr(value, "resolve_expression"):
            return False, None  # an expression such as Now(): the value is the database's to know, not ours
        if field.has_default() and (callable(field.default) or field.default != value):
            return False, None  # an ORM insert would write something else
        return True, value
    if field.null and not field.has_default():
        return True, None
    return False, None


class Insert:
    """``INSERT INTO <table> (<columns of these fields>) VALUES (%s, ...)``, parameters in the order of the fields.

    `keep_existing` adds ``ON DUPLICATE KEY UPDATE <pk> = <pk>``: a row already there stays as it is.
    `only_if`, an SQL condition without parameters, makes it ``INSERT INTO <table> (...) SELECT %s, ... FROM DUAL
    WHERE <condition>``: the row is written only when the condition holds when the statement runs.
    `expressions` writes some fields by an SQL expression instead of a plain parameter, ``{field: expression}``, for
    a statement in a batch that uses what an earlier one made (a user variable holding a new key). An expression
    holds one ``%s``, which takes that field's value, or none, and the field takes no parameter: `parameters(values)`
    turns the fields' values into the statement's parameters.
    `literal_rows(rows)` is the statement for these rows with their values written in as SQL literals, for a bulk
    load whose rows are too many to pass as parameters (see its docstring).
    """

    def __init__(
        self,
        model: type[Model],
        fields: Sequence[str],
        *,
        keep_existing: bool = False,
        only_if: str = "",
        expressions: Mapping[str, str] | None = None,
    ) -> None:
        self.model = model
        self.fields = tuple(fields)
        self.keep_existing = keep_existing
        self.only_if = only_if
        self.expressions = dict(expressions or {})
        if unknown := set(self.expressions) - set(self.fields):
            raise ValueError(f"expressions for fields the statement does not write: {sorted(unknown)}")
        if crowded := [name for name, expression in self.expressions.items() if expression.count("%s") > 1]:
            raise ValueError(f"an expression takes at most one parameter: {crowded}")

    @cached_property
    def columns(self) -> tuple[str, ...]:
        """The columns written, in parameter order."""
        return tuple(_field(self.model, name).column for name in self.fields)

    @property
    def database(self) -> str:
        """The alias of the database the model is routed to, where the statement must run."""
        return router.db_for_write(self.model)

    @cached_property
    def sql(self) -> str:
        return self._statement(rows=1)

    def parameters(self, values: Sequence[Any]) -> list[Any]:
        """Return the statement's parameters for the fields' values (in field order): those of the fields an
        expression without a parameter writes are left out."""
        return [values[i] for i in self._parameter_positions]

    @cached_property
    def _parameter_positions(self) -> tuple[int, ...]:
        return tuple(i for i, name in enumerate(self.fields) if "%s" in self.expressions.get(name, "%s"))

    def literal_rows(self, rows: Sequence[tuple]) -> str:
        """Return the statement for these rows, each value written in as an SQL literal: ``VALUES (1,'a'),(2,'b')``.

        A row is a tuple in the order of the fields. An integer column takes an int (written with %d, so nothing else
        gets in), any other column a str (a DATETIME as 'YYYY-MM-DD HH:MM:SS.ffffff', JSON as its text), quoted as
        the connection to the model's database quotes a parameter. No NULLs: a column a load leaves out gets its
        database default. Text with nothing to escape in it (no quote, backslash or control character the driver
        escapes) is quoted as it is: the statement is first written that way, and if it holds more quotes than its
        text values have ends, or anything to escape, or a None, it is written again escaping every value.
        Why: a large seed writes hundreds of millions of values, and escaping only when something needs it keeps the
        seed's client CPU close to rows formatted by hand, where escaping every value or the driver's parameters
        (one %s per value) cost much more (docs/PERFORMANCE.md, "Nightly analytics").
        """
        if self.only_if:
            raise ValueError("an INSERT guarded by a condition (only_if) writes one row")
        if self.expressions:
            raise ValueError("an INSERT with expressions writes one row")
        if not rows:
            raise ValueError("an INSERT writes at least one row, not 0")
        template, quoted, head, tail = self._literal
        text = ",".join(map(template.__mod__, rows))
        if text.count("'") != 2 * len(quoted) * len(rows) or any(part in text for part in _NEEDS_ESCAPING):
            text = ",".join(self._escaped_rows(rows))
        return head + text + tail

    def _escaped_rows(self, rows: Sequence[tuple]) -> Iterator[str]:
        template, quoted, _, _ = self._literal
        connection = connections[self.database]
        connection.ensure_connection()
        literal = connection.connection.string_literal
        # The connection's literal has the quotes: take them out of the template.
        template = template.replace("'%s'", "%s")
        for row in rows:
            values = list(row)
            for i in quoted:
                values[i] = literal(values[i].encode()).decode()
            yield template % tuple(values)

    @cached_property
    def _literal(self) -> tuple[str, tuple[int, ...], str, str]:
        """Return the row template, the positions of its quoted values, and the statement around the rows."""
        head, _, rest = self.sql.partition(" VALUES (")
        _, _, tail = rest.partition(")")
        formats, quoted = [], []
        for position, name in enumerate(self.fields):
            field = _field(self.model, name)
            if isinstance(field.target_field if field.is_relation else field, IntegerField):
                formats.append("%d")
            else:
                formats.append("'%s'")
                quoted.append(position)
        return f"({','.join(formats)})", tuple(quoted), f"{head} VALUES ", tail

    def _statement(self, *, rows: int) -> str:
        self._row  # noqa: B018 (building it refuses a statement that leaves a column to no default)
        qn = _quote_name(self.model)
        meta = self.model._meta
        columns = ", ".join(qn(column) for column in self.columns)
        placeholders = ", ".join(self.expressions.get(name, "%s") for name in self.fields)
        # Identifiers come from model metadata, quoted; values are query parameters.
        values = f"VALUES {', '.join([f'({placeholders})'] * rows)}"
        if self.only_if:
            values = f"SELECT {placeholders} FROM DUAL WHERE {self.only_if}"  # noqa: S608 (a condition of this module's own)
        sql = f"INSERT INTO {qn(meta.db_table)} ({columns}) {values}"  # noqa: S608
        if self.keep_existing:
            sql += f" ON DUPLICATE KEY UPDATE {qn(meta.pk.column)} = {qn(meta.pk.column)}"
        return sql

    @cached_property
    def _row(self) -> tuple[list[Any], tuple[int, ...], int | None]:
        """Return every concrete field's value as the database fills it, where written values go, and the auto key's
        position when the statement leaves the key to the database."""
        concrete = self.model._meta.concrete_fields
        written = {_field(self.model, name).attname: i for i, name in enumerate(self.fields)}
        row, positions, pk_position = [], [0] * len(written), None
        for position, field in enumerate(concrete):
            if field.attname in written:
                positions[written[field.attname]] = position
                row.append(None)
                continue
            filled, value = _database_value(field)
            if not filled:
                raise ValueError(
                    f"{self.model.__name__}.{field.name} ({field.column}): the INSERT neither writes it nor leaves it"
                    " to a database default; write it, or give the field a db_default"
                )
            if field is self.model._meta.auto_field:
                pk_position = position
            row.append(value)
        return row, tuple(positions), pk_position

    def instance(self, using: str, values: Sequence[Any], *, pk: Any = None) -> Model:
        """Return the model instance this statement wrote, as if read from database `using`.

        `values` are the written fields' Python values (not the adapted parameters), in the statement's order;
        `pk` is the key the database generated, when the statement left it out.
        """
        row, positions, pk_position = self._row
        row = row.copy()
        for position, value in zip(positions, values, strict=True):
            row[position] = value
        if pk_position is not None:
            row[pk_position] = pk
        return self.model.from_db(using, self._attnames, row)

    @cached_property
    def _attnames(self) -> tuple[str, ...]:
        return tuple(field.attname for field in self.model._meta.concrete_fields)


class Update:
    """``UPDATE <table> SET <c> = <c> + %s, ..., <c> = %s, ... WHERE <c> = %s AND ...``.

    Parameters in this order: the `increment` fields' amounts, the `assign` fields' values, the `where` fields' values.
    """

    def __init__(
        self,
        model: type[Model],
        *,
        increment: Sequence[str] = (),
        assign: Sequence[str] = (),
        where: Sequence[str],
    ) -> None:
        self.model = model
        self.increment, self.assign, self.where = tuple(increment), tuple(assign), tuple(where)

    @cached_property
    def sql(self) -> str:
        qn = _quote_name(self.model)

        def column(name: str) -> str:
            return qn(_field(self.model, name).column)

        changes = [f"{column(name)} = {column(name)} + %s" for name in self.increment]
        changes += [f"{column(name)} = %s" for name in self.assign]
        conditions = " AND ".join(f"{column(name)} = %s" for name in self.where)
        # Identifiers come from model metadata, quoted; values are query parameters.
        return f"UPDATE {qn(self.model._meta.db_table)} SET {', '.join(changes)} WHERE {conditions}"  # noqa: S608


_PARAMETER = re.compile(r"%%|%s")


@dataclass(frozen=True)
class Transaction:
    """A transaction's statements (or a part of one), sent in as few round trips as the server allows.

    `begins` puts ``START TRANSACTION`` before them and `commits` ``COMMIT`` after them: Django's atomic would instead
    toggle autocommit around them (``SET autocommit=0``, ``COMMIT``, ``SET autocommit=1``), round trips of their own.
    Without either the statements run inside the caller's transaction.

    `sql` is the whole as one multi-statement batch, one round trip. `round_trips` is the form for a Galera node, one
    statement at a time (``START TRANSACTION`` with the first): there another node's conflicting write set can abort
    the transaction while a batch is still running, and the node reports that abort to no statement of the batch; the
    batch's later statements then run in autocommit, each committing alone, and its COMMIT answers OK for a
    transaction that no longer exists (docs/OPERATIONS.md, "A Galera cluster"). Between two round trips the abort is
    reported to the next statement (error 1213), and the caller rolls back. ``START TRANSACTION`` may share the first
    statement's round trip: the transaction holds no lock before that statement runs, so nothing can abort it there.
    Either way MariaDB stops at the first failing statement with the transaction still open: the caller rolls it back.
    """

    statements: tuple[str, ...]
    begins: bool = True
    commits: bool = True

    def __post_init__(self) -> None:
        if not self.statements:
            raise ValueError("a transaction batch holds at least one statement")
        object.__setattr__(self, "statements", tuple(self.statements))

    @cached_property
    def sql(self) -> str:
        return ";\n".join(self._all)

    @cached_property
    def round_trips(self) -> tuple[str, ...]:
        first, *rest = self.statements
        return (f"START TRANSACTION;\n{first}" if self.begins else first, *rest, *(["COMMIT"] if self.commits else []))

    def round_trip_parameters(self, parameters: Sequence[Any]) -> list[Sequence[Any]]:
        """Split the batch's parameters (statement after statement) into those of each round trip."""
        split, start = [], 0
        for count in self._parameter_counts:
            split.append(parameters[start : start + count])
            start += count
        if start != len(parameters):
            raise ValueError(f"the transaction's statements take {start} parameters, not {len(parameters)}")
        return split

    @cached_property
    def _all(self) -> tuple[str, ...]:
        return (
            *(["START TRANSACTION"] if self.begins else []),
            *self.statements,
            *(["COMMIT"] if self.commits else []),
        )

    @cached_property
    def _parameter_counts(self) -> tuple[int, ...]:
        return tuple(sum(1 for match in _PARAMETER.findall(trip) if match == "%s") for trip in self.round_trips)


def read_converters(connection, fields: Sequence[Field]) -> tuple[tuple, ...]:
    """Return, per field, the (converter, column) pairs the ORM applies to what the database returns for it.

    For a hot path that reads rows with a plain SELECT: worked out once (a raw queryset works them out again on every
    query) and applied by `converted`, so the values read are the ORM's (JSON parsed, datetimes aware).
    """
    converters = []
    for field in fields:
        column = field.get_col(field.model._meta.db_table)
        converters.append(
            tuple(
                (convert, column)
                for convert in connection.ops.get_db_converters(column) + field.get_db_converters(connection)
            )
        )
    return tuple(converters)


def converted(connection, converters: tuple[tuple, ...], row: Sequence[Any]) -> list:
    """Return a row read by a plain SELECT with each value converted as the ORM would (see read_converters)."""
    values = list(row)
    for index, pairs in enumerate(converters):
        for convert, column in pairs:
            values[index] = convert(values[index], column, connection)
    return values
