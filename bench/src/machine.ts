import os from 'node:os'
import type pg from 'pg'

/** Where the numbers were taken: they only mean something next to this. */
export interface MachineInfo {
  cpu: string
  cores: number
  memoryGiB: number
  node: string
  postgres: string
  synchronousCommit: string
  /** 1-minute load average when the run started: other work on the machine makes every number noisier. */
  loadAverage: number
}

export async function describeMachine(pool: pg.Pool): Promise<MachineInfo> {
  const { rows } = await pool.query<{ version: string; synchronous_commit: string }>(
    `SELECT current_setting('server_version') AS version, current_setting('synchronous_commit') AS synchronous_commit`,
  )
  return {
    cpu: os.cpus()[0]?.model.trim() ?? 'unknown',
    cores: os.availableParallelism(),
    memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    node: process.version,
    postgres: rows[0]!.version,
    synchronousCommit: rows[0]!.synchronous_commit,
    loadAverage: Math.round(os.loadavg()[0]! * 100) / 100,
  }
}
