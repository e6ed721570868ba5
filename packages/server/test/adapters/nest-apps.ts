// The contract suite's payments API as a NestJS application, on either of Nest's platforms: auth in a guard (which
// runs before interceptors), the routes in one controller, the handler's errors thrown as Nest's HttpExceptions and
// rendered by Nest's own exception filter.
import 'reflect-metadata'
import type { AddressInfo } from 'node:net'
import {
  type CanActivate,
  Controller,
  HttpCode,
  HttpException,
  Module,
  type ExecutionContext as NestContext,
  Param,
  Post,
  Req,
  Res,
  UnauthorizedException,
} from '@nestjs/common'
import { NestFactory } from '@nestjs/core'
import { ExpressAdapter } from '@nestjs/platform-express'
import { FastifyAdapter } from '@nestjs/platform-fastify'
import type pg from 'pg'
import type { ExecutionContext } from '../../src/engine/types.js'
import type { IdempotencyRouteOptions } from '../../src/http/options.js'
import { IdempotencyContext, Idempotent, OncelyModule } from '../../src/nestjs/index.js'
import { engineFor } from '../helpers.js'
import type { AppOptions, LogLine, RunningApp } from './servers.js'

export type NestPlatform = 'express' | 'fastify'

interface Shared {
  pool: pg.Pool
  gate?: () => Promise<void>
  createPayment(
    ctx: ExecutionContext,
    tenant: string,
    body: never,
    pool: pg.Pool,
  ): Promise<{ status: number; headers: Record<string, string>; body: unknown }>
  transfer(
    ctx: ExecutionContext,
    tenant: string,
    account: string,
    body: never,
  ): Promise<{ status: number; body: unknown }>
  slow(
    ctx: ExecutionContext,
    tenant: string,
    body: never,
    gate?: () => Promise<void>,
  ): Promise<{ status: number; body: unknown }>
  routes: { payments: IdempotencyRouteOptions; notes: IdempotencyRouteOptions; slow: object; waiting: object }
  handlerHeaders: Record<string, string>
  hookHeader: readonly [string, string]
  tenantOf(authorization: string | undefined): string | undefined
  claimed(tenant: string | undefined): string
}

/** A response object of either platform: Express's `res` or Fastify's reply. */
type AnyResponse = {
  header?: (name: string, value: string) => unknown
  setHeader?: (n: string, v: string) => void
}
const setHeaders = (res: AnyResponse, headers: Record<string, string>) => {
  for (const [name, value] of Object.entries(headers)) {
    if (typeof (res as { raw?: unknown }).raw === 'object') res.header!(name, value)
    else res.setHeader!(name, value)
  }
}

/** Nest's way to say what an error means over HTTP: the business errors as HttpExceptions. */
const asHttpException = (error: unknown): unknown => {
  const { statusCode, code, message } = error as { statusCode?: number; code?: string; message?: string }
  if (typeof statusCode !== 'number') return error
  return new HttpException(code ? { statusCode, code, message } : (message ?? 'failed'), statusCode)
}

type TenantRequest = { tenant?: string; headers: Record<string, string | undefined> }

export async function nestApp(
  platform: NestPlatform,
  options: AppOptions,
  shared: Shared,
): Promise<RunningApp> {
  const { pool } = shared
  const { engine, events } = engineFor(pool, options.engine)
  const errors: LogLine[] = []
  const tenant = (request: TenantRequest) => shared.claimed(request.tenant)

  class AuthGuard implements CanActivate {
    canActivate(context: NestContext): boolean {
      const request = context.switchToHttp().getRequest<TenantRequest>()
      const token = shared.tenantOf(request.headers.authorization)
      if (!token) throw new UnauthorizedException({ error: 'unauthorized' })
      request.tenant = token
      setHeaders(context.switchToHttp().getResponse(), Object.fromEntries([shared.hookHeader]))
      return true
    }
  }

  @Controller('v1')
  class PaymentsController {
    @Post('payments')
    @Idempotent({ ...shared.routes.payments, required: true })
    async create(
      @IdempotencyContext() ctx: ExecutionContext,
      @Res({ passthrough: true }) res: AnyResponse,
      @Req() request: TenantRequest & { body: never },
    ) {
      setHeaders(res, shared.handlerHeaders)
      try {
        const result = await shared.createPayment(ctx, tenant(request), request.body, pool)
        setHeaders(res, result.headers)
        return result.body
      } catch (error) {
        throw asHttpException(error)
      }
    }

    @Post('slow')
    @Idempotent(shared.routes.slow)
    async slow(@IdempotencyContext() ctx: ExecutionContext, @Req() request: TenantRequest & { body: never }) {
      return (await shared.slow(ctx, tenant(request), request.body, options.gate)).body
    }

    @Post('waiting')
    @Idempotent(shared.routes.waiting)
    async waiting(
      @IdempotencyContext() ctx: ExecutionContext,
      @Req() request: TenantRequest & { body: never },
    ) {
      return (await shared.slow(ctx, tenant(request), request.body, options.gate)).body
    }

    @Post('notes')
    @HttpCode(200)
    @Idempotent(shared.routes.notes)
    async notes(@IdempotencyContext() ctx: ExecutionContext | null) {
      await ctx?.tx.query('SELECT 1')
      return { ok: true, keyed: ctx !== null }
    }

    @Post('accounts/:account/transfers')
    @Idempotent()
    async transfers(
      @IdempotencyContext() ctx: ExecutionContext,
      @Param('account') account: string,
      @Req() request: TenantRequest & { body: never },
    ) {
      return (await shared.transfer(ctx, tenant(request), account, request.body)).body
    }

    @Post('orders')
    @Idempotent()
    async orders(
      @IdempotencyContext() ctx: ExecutionContext,
      @Req() request: TenantRequest & { body: never },
    ) {
      return (await shared.transfer(ctx, tenant(request), 'orders', request.body)).body
    }
  }

  @Module({
    imports: [
      OncelyModule.forRoot({
        engine,
        tenant,
        logger: { error: (details, msg) => errors.push({ ...details, msg }) },
      }),
    ],
    controllers: [PaymentsController],
  })
  class AppModule {}

  const adapter = platform === 'express' ? new ExpressAdapter() : new FastifyAdapter()
  const app = await NestFactory.create(AppModule, adapter, { rawBody: true, logger: false })
  app.useGlobalGuards(new AuthGuard())
  await app.listen(0, '127.0.0.1')
  const { port } = app.getHttpServer().address() as AddressInfo
  return { url: `http://127.0.0.1:${port}`, events, errors, close: () => app.close() }
}
