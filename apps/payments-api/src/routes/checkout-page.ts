/**
 * Serves the built checkout page (apps/checkout-web/dist) at `/`. A few static files do not need a plugin: this
 * reads them from disk, refuses paths outside the root, and lets hashed assets be cached for good.
 */
import { readFile } from 'node:fs/promises'
import path from 'node:path'
import type { FastifyInstance } from 'fastify'

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.json': 'application/json; charset=utf-8',
  '.map': 'application/json; charset=utf-8',
}

/** The checkout page's build output, next to this app in the monorepo. */
export const DEFAULT_WEB_ROOT = path.resolve(import.meta.dirname, '../../../checkout-web/dist')

/** Registers `GET /` and `GET /assets/*` from `root`. */
export function registerCheckoutPage(app: FastifyInstance, root: string): void {
  const base = path.resolve(root)

  async function serve(relative: string, cache: string) {
    const file = path.resolve(base, relative)
    if (!file.startsWith(base + path.sep)) return undefined
    try {
      const body = await readFile(file)
      return { body, type: TYPES[path.extname(file)] ?? 'application/octet-stream', cache }
    } catch {
      return undefined
    }
  }

  app.get('/', { config: { public: true } }, async (_request, reply) => {
    const file = await serve('index.html', 'no-cache')
    if (!file) {
      return reply
        .code(503)
        .type('text/plain; charset=utf-8')
        .send(`The checkout page is not built (${base}). Run: pnpm --filter @oncely/checkout-web build\n`)
    }
    return reply.type(file.type).header('Cache-Control', file.cache).send(file.body)
  })

  app.get<{ Params: { '*': string } }>('/assets/*', { config: { public: true } }, async (request, reply) => {
    // Vite puts a content hash in every asset name, so an asset never changes under its URL.
    const file = await serve(path.join('assets', request.params['*']), 'public, max-age=31536000, immutable')
    if (!file) return reply.callNotFound()
    return reply.type(file.type).header('Cache-Control', file.cache).send(file.body)
  })
}
