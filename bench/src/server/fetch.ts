// The Fetch adapter (`@oncely/server/fetch`) served by Node's http through @hono/node-server's Request/Response
// bridge, with no router, and its own baseline on the same bridge: the same INSERT, no idempotency.
import type { Server } from 'node:http'
import { serve } from '@hono/node-server'
import { migrate, postgresStore } from '@oncely/server'
import { idempotency } from '@oncely/server/fetch'
import { benchEngine } from './engines.js'
import { insertEntry, recordTransfer, type Transfer } from './ledger.js'
import { ONCELY_SCHEMA } from './oncely.js'
import { listening, type Variant } from './variant.js'

/** Serves `handler` for `POST /ledger` and 404 for anything else. */
function bridge(handler: (request: Request) => Promise<Response>) {
  const server = serve({
    hostname: '127.0.0.1',
    port: 0,
    fetch: (request) =>
      request.method === 'POST' && new URL(request.url).pathname === '/ledger'
        ? handler(request)
        : new Response(null, { status: 404 }),
  })
  return listening(server as Server)
}

export const fetchBaseline: Variant = {
  name: 'fetch-baseline',
  description: 'no idempotency layer, a Request/Response handler on @hono/node-server: BEGIN; INSERT; COMMIT',
  async listen({ pool }) {
    return bridge(async (request) => {
      const transfer = (await request.json()) as Transfer
      const response = await recordTransfer(
        pool,
        request.headers.get('idempotency-key') ?? undefined,
        transfer,
      )
      return Response.json(response.body, { status: response.status })
    })
  },
}

export const oncelyFetch: Variant = {
  name: 'oncely-fetch',
  description: "oncely (reservation: 'lock') through the Fetch adapter, served by @hono/node-server",
  async listen({ pool }) {
    await migrate(pool, { schema: ONCELY_SCHEMA })
    const engine = benchEngine('oncely-fetch', {
      store: postgresStore({ pool, schema: ONCELY_SCHEMA }),
      reservation: 'lock',
    })
    const idempotent = idempotency({ engine, tenant: () => 'bench' })
    return bridge(
      idempotent({ required: true, route: '/ledger' }, async (_request, { body, idempotency: ctx }) => {
        const response = await insertEntry(ctx.tx, ctx.key, body as Transfer)
        return Response.json(response.body, { status: response.status })
      }),
    )
  },
}
