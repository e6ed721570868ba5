/**
 * The demo's stand-in for authentication: `Authorization: Bearer <tenant>` names the tenant. Real deployments put
 * their own authentication here; what matters to idempotency is that every key is scoped to the caller.
 */
import type { FastifyInstance } from 'fastify'
import { demoProblem, sendProblem } from './problems.js'

const BEARER = /^Bearer ([a-z0-9_-]{1,64})$/

declare module 'fastify' {
  interface FastifyRequest {
    /** The authenticated tenant; set by the auth hook on every route but the public ones. */
    tenant: string
  }
  interface FastifyContextConfig {
    /**
     * Anyone may call this route without credentials (the health check, the metrics, the checkout page). Every other
     * route, and a path that matches none, needs them.
     * @default false
     * @example
     * app.get('/healthz', { config: { public: true } }, handler)
     */
    public?: boolean
  }
}

/** Returns the tenant named by an `Authorization` header, or `undefined` when it is missing or malformed. */
export function tenantFromAuthorization(header: string | undefined): string | undefined {
  return header === undefined ? undefined : BEARER.exec(header)?.[1]
}

/**
 * Registers the tenant check as an `onRequest` hook, which runs before the body is read and before any
 * idempotency key is reserved, so an unauthenticated request leaves no trace.
 *
 * It decides on the route the router matched, never on the raw URL: the router decodes the path (`/%761/payments`
 * is `/v1/payments`) and takes an absolute-form target (`POST http://host/v1/payments`) by its path, so a test of
 * the URL's spelling would let such requests through. Failing closed, only routes marked `config.public` skip it.
 */
export function registerAuth(app: FastifyInstance): void {
  app.decorateRequest('tenant', '')
  app.addHook('onRequest', async (request, reply) => {
    if (request.routeOptions.config?.public === true) return
    const tenant = tenantFromAuthorization(request.headers.authorization)
    if (tenant === undefined) {
      reply.header('WWW-Authenticate', 'Bearer')
      return sendProblem(
        reply,
        demoProblem(
          'unauthorized',
          'Send `Authorization: Bearer <tenant>`, where <tenant> is 1 to 64 of [a-z0-9_-].',
        ),
      )
    }
    request.tenant = tenant
  })
}
