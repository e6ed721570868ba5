import { checkIdentifier, quoteIdent } from '../store/identifiers.js'
import { DEFAULT_SCHEMA } from '../store/migrations.js'

/** The quoted outbox table and its NOTIFY channel for a schema (`<schema>.outbox`, created by `migrate()`). */
export function outboxNames(schema: string | undefined): { table: string; channel: string } {
  const name = checkIdentifier('schema', schema ?? DEFAULT_SCHEMA)
  return { table: `${quoteIdent(name)}.outbox`, channel: `${name}.outbox`.slice(0, 63) }
}
