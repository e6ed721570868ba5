// How the node-postgres datasource sends several steps in one message: the simple query protocol takes a string of
// statements separated by semicolons and answers each in order, stopping at the first that fails. It carries no
// parameters, so each statement travels as `EXECUTE name(args)` of an SQL-level prepared statement (planned once
// per connection), or, where nothing may be prepared (a transaction-mode pooler), as its text with the arguments in
// place; either way the arguments are SQL literals, typed by the statement's parameter types.
import type { Statement, Step } from '../store/database.js'
import { quoteLiteral as sqlString } from '../store/identifiers.js'

/** Bodies up to this size travel as a hex literal in a message; larger ones as a binary parameter on their own. */
export const INLINE_BYTES = 32_768

/** One argument as an SQL literal of its parameter's type. */
export function sqlLiteral(value: unknown, type: string): string {
  if (value === null || value === undefined) return 'NULL'
  switch (type) {
    case 'integer':
    case 'float8':
      if (
        typeof value !== 'number' ||
        !Number.isFinite(value) ||
        (type === 'integer' && !Number.isSafeInteger(value))
      )
        throw new TypeError(`Expected a finite ${type}, got ${String(value)}.`)
      return String(value)
    case 'bytea':
      if (!(value instanceof Uint8Array)) throw new TypeError('Expected the bytea argument to be bytes.')
      return `decode('${(Buffer.isBuffer(value) ? value : Buffer.from(value.buffer, value.byteOffset, value.byteLength)).toString('hex')}', 'hex')`
    case 'boolean':
      return value ? 'true' : 'false'
    case 'jsonb':
      return sqlString(typeof value === 'string' ? value : JSON.stringify(value))
    default:
      return sqlString(String(value))
  }
}

/** Whether the steps can travel as one message: every statement typed, and no body too large to inline. */
export function fitsOneMessage(steps: readonly Step[]): boolean {
  for (const step of steps) {
    if (typeof step === 'string') continue
    if (step.types === undefined || step.types.length !== step.values.length) return false
    for (const value of step.values)
      if (value instanceof Uint8Array && value.byteLength > INLINE_BYTES) return false
  }
  return true
}

/** The SQL-level prepared statement of a named, typed statement: its name, and the PREPARE to send once. */
export function sqlPrepared(statement: Statement): { name: string; prepare: string } {
  const name = sqlPreparedName(statement)
  const types = statement.types ?? []
  // Without parameters there is no list at all: Postgres's grammar refuses an empty one, `PREPARE name() AS`.
  return {
    name,
    prepare: `PREPARE ${name}${types.length > 0 ? `(${types.join(', ')})` : ''} AS ${statement.text}`,
  }
}

// The SQL-level name of each statement name: the same string every time, so the lookups in the connection's set of
// prepared names hash it once, not a new concatenation per request.
const sqlNames = new Map<string | undefined, string>()

/** The name of a statement's SQL-level prepared statement. */
export function sqlPreparedName(statement: Statement): string {
  let name = sqlNames.get(statement.name)
  if (name === undefined) {
    // SQL-level and protocol-level prepared statements share one namespace per session: a distinct name.
    name = `${statement.name}_sql`
    sqlNames.set(statement.name, name)
  }
  return name
}

/** A statement as `EXECUTE name(args)`. */
export function executeText(statement: Statement): string {
  const types = statement.types ?? []
  const { values } = statement
  let args = ''
  for (let i = 0; i < values.length; i++)
    args += `${i > 0 ? ', ' : ''}${sqlLiteral(values[i], types[i] ?? 'text')}`
  // `EXECUTE name()` is a syntax error, like an empty PREPARE list.
  return `EXECUTE ${sqlPreparedName(statement)}${values.length > 0 ? `(${args})` : ''}`
}

/**
 * A statement's text with its arguments in place of `$n`, each cast to its type (outside quoted strings and
 * quoted identifiers, where a `$` is not a parameter).
 */
export function inlineText(statement: Statement): string {
  const types = statement.types ?? []
  return statement.text.replace(/'(?:[^']|'')*'|"(?:[^"]|"")*"|\$(\d+)/g, (match, index?: string) => {
    if (index === undefined) return match
    const i = Number(index) - 1
    const type = types[i] ?? 'text'
    return `CAST(${sqlLiteral(statement.values[i], type)} AS ${type})`
  })
}
