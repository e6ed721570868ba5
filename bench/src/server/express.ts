// The Express adapter (`@oncely/server/express`, on Express 5) and its own baseline: the same INSERT on Express with
// express.json() and no idempotency, so the adapter is divided by a route that pays Express's own cost.
import { createServer } from 'node:http'
import { migrate, postgresStore } from '@oncely/server'
import { idempotency } from '@oncely/server/express'
import express from 'express'
import { benchEngine } from './engines.js'
import { headerKey, insertEntry, recordTransfer, type Transfer } from './ledger.js'
import { ONCELY_SCHEMA } from './oncely.js'
import { listening, type Variant } from './variant.js'

const serve = (app: express.Express) => listening(createServer(app).listen(0, '127.0.0.1'))

export const expressBaseline: Variant = {
  name: 'express-baseline',
  description: 'no idempotency layer on Express 5 (express.json()): BEGIN; INSERT; COMMIT',
  async listen({ pool }) {
    const app = express()
    app.use(express.json())
    app.post('/ledger', async (req, res) => {
      const response = await recordTransfer(pool, headerKey(req.get('idempotency-key')), req.body as Transfer)
      res.status(response.status).json(response.body)
    })
    return serve(app)
  },
}

export const oncelyExpress: Variant = {
  name: 'oncely-express',
  description: "oncely (reservation: 'lock') through the Express adapter on Express 5",
  async listen({ pool }) {
    await migrate(pool, { schema: ONCELY_SCHEMA })
    const engine = benchEngine('oncely-express', {
      store: postgresStore({ pool, schema: ONCELY_SCHEMA }),
      reservation: 'lock',
    })
    const app = express()
    // No express.json(): the adapter reads and checks the body itself.
    const idempotent = idempotency({ engine, tenant: () => 'bench' })
    app.post(
      '/ledger',
      idempotent({ required: true }, async (req, res) => {
        const response = await insertEntry(req.idempotency.tx, req.idempotency.key, req.body as Transfer)
        res.status(response.status).json(response.body)
      }),
    )
    return serve(app)
  },
}
