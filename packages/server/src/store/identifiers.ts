/** Quotes a Postgres identifier (schema, table or index name), doubling embedded quotes. */
export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`
}

const NEEDS_ESCAPE = /['\\]/

/**
 * A string as an SQL literal, correct whatever `standard_conforming_strings` is (the rules of pg's escapeLiteral):
 * the one place oncely writes a literal, for a constant a statement embeds and for the arguments a datasource
 * inlines into a message.
 */
export function quoteLiteral(value: string): string {
  // Most values (uuids, hex digests, plain keys) need no escaping: one scan instead of two replacements.
  if (!NEEDS_ESCAPE.test(value)) return `'${value}'`
  const quoted = `'${value.replaceAll("'", "''")}'`
  return value.includes('\\') ? ` E${quoted.replaceAll('\\', '\\\\')}` : quoted
}

/** The longest identifier Postgres keeps, in bytes (NAMEDATALEN - 1). */
const MAX_IDENTIFIER_BYTES = 63

/** The first `bytes` bytes of `name` in UTF-8, cut back to a whole character. */
function clipBytes(name: string, bytes: number): string {
  const encoded = Buffer.from(name)
  if (encoded.length <= bytes) return name
  let end = bytes
  while (end > 0 && ((encoded[end] as number) & 0xc0) === 0x80) end--
  return encoded.subarray(0, end).toString()
}

/**
 * The name Postgres gives a constraint it names itself, such as `idempotency_keys_pkey` or
 * `idempotency_keys_status_check`: its makeObjectName(), which shortens the longer of the table's and the column's
 * names until the whole fits in 63 bytes.
 */
export function constraintName(table: string, column: string | null, label: string): string {
  let tableBytes = Buffer.byteLength(table)
  let columnBytes = column === null ? 0 : Buffer.byteLength(column)
  const available = MAX_IDENTIFIER_BYTES - (label.length + 1) - (column === null ? 0 : 1)
  while (tableBytes + columnBytes > available) {
    if (tableBytes > columnBytes) tableBytes--
    else columnBytes--
  }
  const parts = [clipBytes(table, tableBytes), ...(column === null ? [] : [clipBytes(column, columnBytes)])]
  return [...parts, label].join('_')
}

/** Checks a schema or table name given as an option; Postgres truncates identifiers longer than 63 bytes. */
export function checkIdentifier(option: string, value: unknown): string {
  if (
    typeof value !== 'string' ||
    value.length === 0 ||
    Buffer.byteLength(value) > 63 ||
    value.includes('\0')
  ) {
    throw new TypeError(`Expected \`${option}\` to be a non-empty identifier of at most 63 bytes.`)
  }
  return value
}

/** The quoted identifiers the SQL of the store and of the migrations is written against. */
export interface TableNames {
  /** The schema, unquoted. */
  schema: string
  /** The table, unquoted. */
  table: string
  /** `"schema"."table"`, quoted once here so no query quotes again. */
  qualified: string
  /** The name of the table's primary key (unquoted), which a unique violation names. */
  primaryKey: string
}

export function tableNames(schema: string, table: string): TableNames {
  return {
    schema,
    table,
    qualified: `${quoteIdent(schema)}.${quoteIdent(table)}`,
    primaryKey: constraintName(table, null, 'pkey'),
  }
}
