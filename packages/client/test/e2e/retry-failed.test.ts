// Trying a named intent again after a decline, against the real server (@oncely/server on Postgres), which stores
// a 402 as the key's final outcome and replays it for that key.
import { afterAll, beforeAll, expect, it } from 'vitest'
import {
  createClient,
  HTTPError,
  IdempotencyKeyReusedError,
  memoryStore,
  type OncelyClient,
} from '../../src/index.js'
import { startOncelyServer } from '../support/oncely-server.js'

let server: Awaited<ReturnType<typeof startOncelyServer>>
const clients: OncelyClient[] = []

beforeAll(async () => {
  server = await startOncelyServer('client_retry_failed')
})
afterAll(async () => {
  await Promise.all(clients.map((client) => client.close()))
  await server?.close()
})

const device = () => {
  const client = createClient({ baseUrl: server.url, store: memoryStore(), resumeOnOnline: false })
  clients.push(client)
  return client
}
const pay = (client: OncelyClient, intentId: string, card: string, retryFailed?: boolean) =>
  client.request<{ id: string }>({
    path: '/v1/payments',
    json: { amount: 30, card },
    intentId,
    ...(retryFailed === undefined ? {} : { retryFailed }),
  })

it('without retryFailed, a declined intent answers its decline again, and another card is refused', async () => {
  server.declined.add('card_a')
  const client = device()
  const first = await pay(client, 'checkout:cart_1', 'card_a').catch((error: unknown) => error)
  expect(first).toBeInstanceOf(HTTPError)
  expect(first).toMatchObject({ status: 402 })
  expect(await pay(client, 'checkout:cart_1', 'card_a').catch((e: unknown) => e)).toMatchObject({
    status: 402,
  })
  expect(await pay(client, 'checkout:cart_1', 'card_b').catch((e: unknown) => e)).toBeInstanceOf(
    IdempotencyKeyReusedError,
  )
})

it('with retryFailed, a try after a decline is a new try under a new key, with another card', async () => {
  server.declined.add('card_a')
  const client = device()
  const keys: string[] = []
  const declined = await client
    .request({
      path: '/v1/payments',
      json: { amount: 30, card: 'card_a' },
      intentId: 'checkout:cart_2',
      retryFailed: true,
      onIntent: ({ key }) => keys.push(key),
    })
    .catch((error: unknown) => error)
  expect(declined).toMatchObject({ status: 402 })
  const before = await server.effects()
  const paid = await pay(client, 'checkout:cart_2', 'card_b', true)
  expect(paid).toMatchObject({ status: 201, source: 'network' })
  expect(paid.key).not.toBe(keys[0])
  expect(await server.effects()).toBe(before + 1)
  // A double click after the success: the success, from the store; nothing is sent or run again.
  const sent = server.keys.length
  expect(await pay(client, 'checkout:cart_2', 'card_b', true)).toMatchObject({
    source: 'store',
    key: paid.key,
  })
  expect(server.keys.length).toBe(sent)
})

it('every device walks the same tries: a try that succeeded elsewhere is replayed, not run again', async () => {
  server.declined.add('card_c')
  const phone = device()
  const laptop = device()
  expect(await pay(phone, 'checkout:cart_3', 'card_c').catch((e: unknown) => e)).toMatchObject({
    status: 402,
  })
  server.declined.delete('card_c') // the customer topped the card up
  const before = await server.effects()
  // The laptop knows nothing of the decline: the server replays it for the first key, so it tries the next one.
  const onLaptop = await pay(laptop, 'checkout:cart_3', 'card_c', true)
  expect(onLaptop).toMatchObject({ status: 201, source: 'network' })
  // The phone has the decline in its store: its new try is the same second key, which the server replays.
  const onPhone = await pay(phone, 'checkout:cart_3', 'card_c', true)
  expect(onPhone).toMatchObject({ status: 201, source: 'replay', key: onLaptop.key, data: onLaptop.data })
  expect(await server.effects()).toBe(before + 1)
})
