// The lingering close behind every refusal before the body is read: the answer goes out at once, the rest of the
// body is read and thrown away, and the connection closes when the body ended, or when the limits cut it short.
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { connect } from 'node:net'
import { problem } from '@oncely/protocol'
import { parseRawResponse, rawFlood } from '@oncely/test-support'
import { afterEach, expect, it } from 'vitest'
import { problemAnswer } from '../../src/http/answer.js'
import { nodeChunks } from '../../src/http/node.js'
import { type DrainLimits, refuse } from '../../src/http/refusal.js'

let server: Server | undefined
afterEach(async () => {
  await new Promise((resolve) => server?.close(resolve))
})

/** A server that refuses every request at once (before reading its body), discarding the rest within `limits`. */
async function refusing(limits: DrainLimits): Promise<string> {
  server = createServer((request, response) => {
    const refusal = refuse(
      problemAnswer(problem('payload_too_large', 'Too large.')),
      nodeChunks(request),
      limits,
    )
    response.writeHead(refusal.status, refusal.headers)
    void refusal.body.pipeTo(
      new WritableStream({ write: (chunk) => void response.write(chunk), close: () => void response.end() }),
    )
  })
  await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve))
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}

it('closes the connection once the discarded bytes pass the limit, after sending the answer', async () => {
  const url = await refusing({ bytes: 1_048_576, ms: 60_000 })
  // 250 MiB if the server never closed; it closes after about 1 MiB.
  const flood = await rawFlood({ url, path: '/', headers: {}, bytes: 250 * 1_048_576 })
  expect(flood.closed).toBe(true)
  expect(flood.response?.status).toBe(413)
  expect(flood.written).toBeLessThan(64 * 1_048_576)
})

it('closes the connection of a client that stops sending once the time limit passed, after sending the answer', async () => {
  const url = await refusing({ bytes: 1_048_576, ms: 200 })
  // One chunk, then nothing: the body never ends, and only the time limit closes the connection.
  const flood = await rawFlood({ url, path: '/', headers: {}, bytes: 65_536 })
  expect(flood.closed).toBe(true)
  expect(flood.response?.status).toBe(413)
})

it('ends the response as soon as the body ended, leaving nothing unread', async () => {
  const url = await refusing({ bytes: 1_048_576, ms: 60_000 })
  const socket = connect(Number(new URL(url).port), '127.0.0.1')
  socket.on('error', () => {})
  socket.write('POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello')
  let received = Buffer.alloc(0)
  socket.on('data', (data) => {
    received = Buffer.concat([received, data])
  })
  // The server closes (Connection: close) well before the 60 s limit: the 'end' event settles the test.
  await new Promise((resolve) => socket.once('end', resolve))
  const response = parseRawResponse(received)
  expect(response?.status).toBe(413)
  expect(response?.headers.connection).toBe('close')
  expect(JSON.parse(response?.body ?? '')).toMatchObject({ code: 'payload_too_large' })
  socket.destroy()
})
