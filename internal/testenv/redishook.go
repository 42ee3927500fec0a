package testenv

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// CommandHook is a go-redis hook (Client.AddHook) that calls itself with
// every command the client sends, each command of a pipeline or MULTI on
// its own, before it is sent: what tests count Redis work with.
type CommandHook func(cmd redis.Cmder)

var _ redis.Hook = CommandHook(nil)

// DialHook implements redis.Hook.
func (h CommandHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h CommandHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (h CommandHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h(cmd)
		}
		return next(ctx, cmds)
	}
}
