import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'

/**
 * A small real HTTP server with an in-memory idempotency key table, standing in for @oncely/server in the client's
 * end-to-end tests: reserve the key, count one effect, store the response, replay it (`Idempotent-Replayed: true`),
 * 409 + Retry-After while in progress, 422 when the key comes back with another body.
 *
 * `dropResponses` makes it commit the effect (or find the stored response) and then destroy the socket without
 * answering: the lost-response case.
 */
export interface TestServer {
  url: string
  /** Every POST seen, in order. */
  requests: { key: string | undefined; attempt: string | undefined; body: string }[]
  /** Effects made, by key: the ledger the tests check. */
  effects: Map<string, number>
  dropResponses: boolean
  /** How long the handler works before committing (to make attempts overlap). */
  workMs: number
  /** While true, answer 503 before reserving the key (no effect): the server is down. */
  unavailable: boolean
  /** Static files served on GET. */
  files: Map<string, { type: string; body: string }>
  close(): Promise<void>
}

interface Entry {
  body: string
  state: 'in_progress' | 'done'
  response?: { status: number; text: string }
}

export async function startIdempotentServer(): Promise<TestServer> {
  const table = new Map<string, Entry>()
  const state = {
    requests: [] as TestServer['requests'],
    effects: new Map<string, number>(),
    dropResponses: false,
    workMs: 0,
    unavailable: false,
    files: new Map<string, { type: string; body: string }>(),
  }
  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    if (req.method === 'GET') {
      const file = state.files.get(new URL(req.url ?? '/', 'http://x').pathname)
      if (!file) return res.writeHead(404).end()
      return res.writeHead(200, { 'content-type': file.type, 'cache-control': 'no-store' }).end(file.body)
    }
    const chunks: Buffer[] = []
    for await (const chunk of req) chunks.push(chunk as Buffer)
    const body = Buffer.concat(chunks).toString('utf8')
    const key = header(req, 'idempotency-key')
    state.requests.push({ key, attempt: header(req, 'oncely-attempt'), body })
    if (state.unavailable) return json(res, 503, { title: 'unavailable', status: 503 })
    if (!key) return json(res, 400, { title: 'Idempotency-Key header is required', status: 400 })
    const entry = table.get(key)
    if (entry) {
      if (entry.body !== body) return json(res, 422, { title: 'Idempotency-Key reused', status: 422 })
      if (entry.state === 'in_progress')
        return json(res, 409, { title: 'in progress', status: 409 }, { 'retry-after': '1' })
      if (state.dropResponses) return req.socket.destroy()
      return reply(res, entry.response!, true)
    }
    const mine: Entry = { body, state: 'in_progress' }
    table.set(key, mine)
    if (state.workMs > 0) await new Promise((resolve) => setTimeout(resolve, state.workMs))
    state.effects.set(key, (state.effects.get(key) ?? 0) + 1)
    mine.response = {
      status: 201,
      text: JSON.stringify({ id: `pay_${state.effects.size}`, body: JSON.parse(body || 'null') }),
    }
    mine.state = 'done'
    if (state.dropResponses) return req.socket.destroy()
    reply(res, mine.response, false)
  }
  const server = createServer((req, res) => {
    handle(req, res).catch((error) => res.writeHead(500).end(String(error)))
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  return Object.assign(state, {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  })
}

function header(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name]
  return Array.isArray(value) ? value.join(', ') : value
}

function json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) {
  res.writeHead(status, { 'content-type': 'application/problem+json', ...headers }).end(JSON.stringify(body))
}

function reply(res: ServerResponse, response: { status: number; text: string }, replayed: boolean) {
  res
    .writeHead(response.status, {
      'content-type': 'application/json',
      ...(replayed ? { 'idempotent-replayed': 'true' } : {}),
    })
    .end(response.text)
}
