import { defineConfig } from 'tsup'

export default defineConfig({
  entry: {
    index: 'src/index.ts',
    fastify: 'src/fastify/index.ts',
    express: 'src/express/index.ts',
    fetch: 'src/fetch/index.ts',
    nestjs: 'src/nestjs/index.ts',
    outbox: 'src/outbox/index.ts',
    inbox: 'src/inbox/index.ts',
    steps: 'src/steps/index.ts',
    redis: 'src/redis/index.ts',
    nats: 'src/nats/index.ts',
    webhooks: 'src/webhooks/index.ts',
    jobs: 'src/jobs/index.ts',
    otel: 'src/otel/index.ts',
    testing: 'src/testing/index.ts',
  },
  format: ['esm', 'cjs'],
  dts: true,
  clean: true,
  sourcemap: true,
  target: 'node20',
  platform: 'node',
  shims: true,
  noExternal: ['@oncely/protocol'],
})
