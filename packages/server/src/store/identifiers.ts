/** Quotes a Postgres identifier (schema, table or index name), doubling embedded quotes. */
export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`
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
}

export function tableNames(schema: string, table: string): TableNames {
  return { schema, table, qualified: `${quoteIdent(schema)}.${quoteIdent(table)}` }
}
