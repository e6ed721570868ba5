// Every oncely engine the bench server builds goes through here, which records the protocol the engine reports it
// runs (`engine.options.reservation`) under the variant's name: test/variants.test.ts holds each name to it, since a
// variant named for one protocol once measured the other.
import { createEngine, type Engine, type EngineOptions } from '@oncely/server'

const protocols = new Map<string, 'lock' | 'row'>()

/** `createEngine(options)` for the variant `name`, the protocol stated rather than left to the default. */
export function benchEngine<Tx>(
  name: string,
  options: EngineOptions<Tx> & { reservation: 'lock' | 'row' },
): Engine<Tx> {
  const engine = createEngine(options)
  protocols.set(name, engine.options.reservation)
  return engine
}

/** The protocol of the engine the variant `name` built, if it built one. */
export const builtProtocol = (name: string) => protocols.get(name)
