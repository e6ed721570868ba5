// `failOpen: true`: when the store cannot reserve, the handler still runs, in a plain transaction with no key record.
// It is a reservation that claims every key and stores nothing, so the attempt runner treats it like the others.
import type { Database } from '../store/database.js'
import type { Claim, ReservationProtocol, ReserveRequest } from '../store/reservation.js'

export interface FailOpenReservation<Tx> extends Omit<ReservationProtocol<Claim<Tx>>, 'reserve'> {
  /** Always claims: opens a session and begins a transaction (rejects only when that fails). */
  reserve(request: ReserveRequest): Promise<{ kind: 'claimed'; claim: Claim<Tx> }>
}

export function failOpenReservation<Tx>(database: Database<Tx>): FailOpenReservation<Tx> {
  return {
    async reserve(request) {
      const session = await database.session()
      try {
        await session.run(['BEGIN'])
      } catch (error) {
        session.release(error as Error)
        throw error
      }
      return {
        kind: 'claimed',
        claim: {
          request,
          session,
          attempt: 1,
          recoveryPoint: null,
          replaced: null,
          expiresInMs: 0,
          server: 0,
        },
      }
    },
    inspect: async () => ({ kind: 'free' }),
    renew: async () => true,
    async complete(claim) {
      await claim.session.run(['COMMIT'])
      return true
    },
    // Nothing is stored: a permanent failure is answered once and forgotten, like any request without a key.
    fail: async () => true,
    release: async () => {},
    saveRecoveryPoint: async () => false,
  }
}
