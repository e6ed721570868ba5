export type { BackstopOptions, BackstopResult } from './backstop.js'
export { insertOrExisting } from './backstop.js'
export type { NodePostgresOptions } from './datasources/node-postgres.js'
export { nodePostgres } from './datasources/node-postgres.js'
export { defaultClassify, defaultRenderError } from './engine/classify.js'
export { createEngine, stepKeyFor } from './engine/engine.js'
export type { ReplayCacheOptions } from './engine/replay-cache.js'
export { DEFAULT_REPLAY_HEADERS } from './engine/response.js'
export type {
  Engine,
  EngineEvent,
  EngineOptions,
  ErrorClass,
  ExecuteInput,
  ExecutionContext,
  HandlerResponse,
  KeyId,
  Outcome,
  ReaperOptions,
  ReapOptions,
  StoredResponse,
} from './engine/types.js'
export {
  isOncelyServerError,
  isResponseTooLargeError,
  isStoreSetupError,
  OncelyServerError,
  ResponseTooLargeError,
  StoreSetupError,
} from './errors.js'
export type { CorsHeaderOptions, CorsHeaders } from './http/cors.js'
export { corsHeaders } from './http/cors.js'
export type { DistributeOptions, DistributeResult } from './store/citus.js'
export { distribute } from './store/citus.js'
export type { Database, Rows, Session, Statement, Step } from './store/database.js'
export type { MigrateResult, Migration, MigrationTarget } from './store/migrations.js'
export { DEFAULT_SCHEMA, DEFAULT_TABLE, migrate, migrations, renderMigrations } from './store/migrations.js'
export type {
  DatabaseStoreOptions,
  PoolStoreOptions,
  PostgresStore,
  PostgresStoreOptions,
} from './store/postgres-store.js'
export { postgresStore } from './store/postgres-store.js'
