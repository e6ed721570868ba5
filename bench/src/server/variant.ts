import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { FastifyInstance } from 'fastify'
import type pg from 'pg'

/** What a variant gets to build its routes: the shared pool on the bench database and the addresses behind it. */
export interface VariantContext {
  pool: pg.Pool
  /** The bench database, for the variants that open a library's own connections (postgres.js, Knex, Prisma...). */
  databaseUrl: string
  /** Connections each variant may open, as the shared pool has. */
  poolSize: number
  /**
   * How long an idle connection stays open. Short, so the pools of the variants not under load give theirs back:
   * every library is opened twice (oncely and its baseline), and all the pools at `poolSize` at once would hold more
   * connections than a default `max_connections` of 100, which answered "too many clients" under the timed runs.
   */
  idleMs: number
  redisUrl: string
}

/** A variant's own HTTP server, listening on 127.0.0.1. */
export interface Listening {
  port: number
  close(): Promise<void>
}

/**
 * One way of serving `POST /ledger`, on its own port. Most register routes on an encapsulated Fastify scope (`setup`,
 * returning a function that closes what it opened); the adapters of other frameworks start a server of their own
 * (`listen`).
 */
export type Variant = {
  name: string
  /** What it stores keys in and what it guarantees, for the report. */
  description: string
} & (
  | { setup(scope: FastifyInstance, context: VariantContext): Promise<() => Promise<void>>; listen?: never }
  | { listen(context: VariantContext): Promise<Listening>; setup?: never }
)

/** Waits for `server` (already told to listen on 127.0.0.1, port 0) and describes it as a variant's listener. */
export async function listening(server: Server): Promise<Listening> {
  if (!server.listening) await new Promise((resolve) => server.once('listening', resolve))
  // Idle keep-alive sockets of the load generator would otherwise hold close() open.
  const close = () =>
    new Promise<void>((resolve) => {
      server.close(() => resolve())
      server.closeAllConnections()
    })
  return { port: (server.address() as AddressInfo).port, close }
}
