%% The Distributed Erlang side of `maquis-bench debench`: DE-Bench's worker loop, the same as the
%% Maquis agents run. One VM is one node `dbI@127.0.0.1`; it connects to every other node, starts
%% its server process (a gen_server registered as debench_srv), prints "ready", and then reads
%% stdin: a line "go W GlobalPct LocalPct ServerPct ArgBytes ComputeUs Seconds PaceUs Iters" runs W
%% workers for Seconds and prints one line "result {json}"; "quit" (or the end of stdin) halts
%% the VM. With PaceUs > 0 a worker starts a command (or a global sequence) every PaceUs
%% microseconds (its waits have millisecond resolution) instead of as soon as the last one
%% ended, without catching up on starts it missed.
%%
%% A worker picks a random other node and a command: with GlobalPct % the global sequence
%% (global:register_name -> global:whereis_name -> global:unregister_name of a unique name,
%% DE-Bench Fig. 4), with LocalPct % the local one (register -> whereis -> unregister), else a
%% point-to-point command: with ServerPct % a gen_server call, else spawn or rpc (half each).
%% Point-to-point commands carry ArgBytes bytes and compute for ComputeUs microseconds on the
%% target before answering; a spawn is timed until the new process acknowledges. The
%% computation is Iters iterations of burn/2: the driver ran calibrate/0 once in a VM of its own
%% before any cluster started and asks for ComputeUs times its iterations per microsecond. Not
%% a loop that watches the clock: the schedulers preempt a process after a few thousand
%% reductions, and clock-watching loops of several processes overlap and burn far less CPU
%% than they claim.
%% Latencies are counted in logarithmic buckets (2 % wide), as the Maquis side does.
-module(debench).
-behaviour(gen_server).
-export([run/2, spawned/3, compute_ret/2, calibrate/0]).
-export([init/1, handle_call/3, handle_cast/2]).

-define(TIMEOUT, 10000).

run(Index, N) ->
    {ok, _} = gen_server:start({local, debench_srv}, ?MODULE, [], []),
    Others = [name(I) || I <- lists:seq(1, N), I =/= Index],
    connect(Others),
    io:format("ready~n"),
    serve(Others).

name(I) -> list_to_atom("db" ++ integer_to_list(I) ++ "@127.0.0.1").

%% Connects to every other node, retrying those that are not up yet.
connect([]) -> ok;
connect(Nodes) ->
    Left = [Nd || Nd <- Nodes, net_kernel:connect_node(Nd) =/= true],
    case Left of
        [] -> ok;
        _ -> timer:sleep(100), connect(Left)
    end.

serve(Others) ->
    case io:get_line('') of
        "go " ++ Rest ->
            [W, G, L, S, X, _Y, Secs, Pace, Iters] = [list_to_integer(T) || T <- string:lexemes(string:trim(Rest), " ")],
            %% Percentages arrive in hundredths of a percent (1 = 0.01 %).
            io:format("result ~s~n", [measure(Others, W, G / 100, L / 100, S / 100, X, Iters, Secs, Pace)]),
            serve(Others);
        _ -> halt(0)
    end.

measure(Others, W, G, L, S, X, Iters, Secs, Pace) ->
    Self = self(),
    Arg = binary:copy(<<16#42>>, X),
    Deadline = erlang:monotonic_time(microsecond) + Secs * 1000000,
    Cfg = {list_to_tuple(Others), G, L, S, Arg, Iters, Deadline, Pace},
    {Cpu0, _} = erlang:statistics(runtime),
    T0 = erlang:monotonic_time(microsecond),
    %% Paced workers start at random points of their first interval, not all at once.
    First = fun() -> T0 + trunc(rand:uniform() * Pace) end,
    [spawn_link(fun() -> Self ! {done, worker(Cfg, I, First(), #{})} end) || I <- lists:seq(1, W)],
    Stats = lists:foldl(fun(_, Acc) -> receive {done, St} -> merge(Acc, St) end end, #{},
                        lists:seq(1, W)),
    T1 = erlang:monotonic_time(microsecond),
    {Cpu1, _} = erlang:statistics(runtime),
    json(Stats, (T1 - T0) / 1.0e6, (Cpu1 - Cpu0) / 1000).

worker({_, _, _, _, _, _, Deadline, Pace} = Cfg, I, Next, St) when Pace > 0 ->
    Now = erlang:monotonic_time(microsecond),
    Wait = (Next - Now + 999) div 1000,
    if Wait > 0 -> receive after Wait -> ok end;
       true -> ok
    end,
    case erlang:monotonic_time(microsecond) >= Deadline of
        true -> St;
        false ->
            St1 = command(Cfg, I, St),
            worker(Cfg, I, max(Next + Pace, erlang:monotonic_time(microsecond)), St1)
    end;
worker({_, _, _, _, _, _, Deadline, _} = Cfg, I, Next, St) ->
    case erlang:monotonic_time(microsecond) >= Deadline of
        true -> St;
        false -> worker(Cfg, I, Next, command(Cfg, I, St))
    end.

%% One command (or one global or local sequence) to a random other node.
command({Others, G, L, S, Arg, Iters, _, _}, I, St) ->
    Target = element(rand:uniform(tuple_size(Others)), Others),
    R = rand:uniform() * 100,
    if
        R < G -> global_seq(I, St);
        R < G + L -> local_seq(I, St);
        true ->
            case rand:uniform() * 100 < S of
                true -> timed(call, fun() -> gen_server:call({debench_srv, Target}, {compute, Arg, Iters}, ?TIMEOUT) end, St);
                false ->
                    case rand:uniform(2) of
                        1 -> timed(spawn, fun() -> spawn_ack(Target, Arg, Iters) end, St);
                        2 -> timed(rpc, fun() -> rpc:call(Target, ?MODULE, compute_ret, [Arg, Iters], ?TIMEOUT) end, St)
                    end
            end
    end.

global_seq(I, St) ->
    Name = {debench, node(), I, erlang:unique_integer()},
    St1 = timed(register, fun() -> yes = global:register_name(Name, self()) end, St),
    St2 = timed(whereis, fun() -> true = is_pid(global:whereis_name(Name)) end, St1),
    timed(unregister, fun() -> global:unregister_name(Name) end, St2).

local_seq(I, St) ->
    Name = list_to_atom("debench_w" ++ integer_to_list(I)),
    timed(local_register, fun() ->
        true = register(Name, self()),
        true = is_pid(whereis(Name)),
        true = unregister(Name)
    end, St).

spawn_ack(Target, Arg, Iters) ->
    Self = self(),
    Ref = make_ref(),
    spawn(Target, ?MODULE, spawned, [{Self, Ref}, Arg, Iters]),
    receive {Ref, ok} -> ok after ?TIMEOUT -> error(timeout) end.

spawned({From, Ref}, Arg, Iters) ->
    From ! {Ref, ok},
    compute_ret(Arg, Iters).

compute_ret(Arg, Iters) ->
    burn(Iters, 1),
    Arg.

%% Iterations of burn/2 per microsecond: the fastest of several timed runs (a run that was
%% preempted is slower, never faster).
calibrate() ->
    Chunk = 50000,
    Best = lists:min([element(1, timer:tc(fun() -> burn(Chunk, 1) end)) || _ <- lists:seq(1, 50)]),
    Chunk / max(Best, 1).

burn(0, Acc) -> Acc;
burn(N, Acc) -> burn(N - 1, (Acc * 31 + 7) band 16#FFFFFF).

%% Runs F, counting its latency under Kind (or an error).
timed(Kind, F, St) ->
    T0 = erlang:monotonic_time(microsecond),
    Ok = try F(), true catch _:_ -> false end,
    Us = max(erlang:monotonic_time(microsecond) - T0, 1),
    {Count, Errors, Buckets} = maps:get(Kind, St, {0, 0, #{}}),
    case Ok of
        true ->
            B = bucket(Us),
            St#{Kind => {Count + 1, Errors, Buckets#{B => maps:get(B, Buckets, 0) + 1}}};
        false ->
            St#{Kind => {Count, Errors + 1, Buckets}}
    end.

bucket(Us) -> trunc(math:log(Us) / math:log(1.02)).

merge(A, B) ->
    maps:fold(fun(K, {C, E, Bs}, Acc) ->
        {C0, E0, Bs0} = maps:get(K, Acc, {0, 0, #{}}),
        Acc#{K => {C0 + C, E0 + E, maps:fold(fun(Bk, N, M) -> M#{Bk => maps:get(Bk, M, 0) + N} end, Bs0, Bs)}}
    end, A, B).

json(Stats, Secs, Cpu) ->
    Kinds = [io_lib:format("\"~s\":{\"count\":~b,\"errors\":~b,\"buckets\":[~s]}",
                           [K, C, E, lists:join(",", [io_lib:format("[~b,~b]", [Bk, N]) || {Bk, N} <- lists:sort(maps:to_list(Bs))])])
             || {K, {C, E, Bs}} <- lists:sort(maps:to_list(Stats))],
    lists:flatten(io_lib:format("{\"seconds\":~.6f,\"cpu_s\":~.6f,\"commands\":{~s}}",
                                [Secs, Cpu, lists:join(",", Kinds)])).

%% The server process: computes and answers.
init([]) -> {ok, nostate}.
handle_call({compute, Arg, Iters}, _From, State) -> {reply, compute_ret(Arg, Iters), State}.
handle_cast(_, State) -> {noreply, State}.
