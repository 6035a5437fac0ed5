// The few MPI calls tpsp makes, for a build without MPI (-DTPSP_MPI=OFF):
// one process, world size 1, every collective a copy. It exists for machines
// that have a GPU but no MPI to install (the GPU check box); the code above
// it is the same as with MPI, and a ring of one rank never sends.
// In the spirit of LAMMPS's STUBS/mpi.h.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

typedef int MPI_Comm;
typedef int MPI_Datatype;
typedef int MPI_Op;
typedef int MPI_Request;
struct MPI_Status {
    int MPI_SOURCE, MPI_TAG, MPI_ERROR;
};

#define TPSP_SINGLE_PROCESS_MPI 1  // what `tpsp versions` reports
#define MPI_SUCCESS 0
#define MPI_MAX_LIBRARY_VERSION_STRING 64
#define MPI_COMM_NULL 0
#define MPI_COMM_WORLD 1
#define MPI_REQUEST_NULL 0
#define MPI_IN_PLACE (reinterpret_cast<void*>(1))
#define MPI_STATUS_IGNORE (static_cast<MPI_Status*>(nullptr))
#define MPI_CHAR 1
#define MPI_BYTE 1
#define MPI_INT 4
#define MPI_FLOAT 5
#define MPI_DOUBLE 8
#define MPI_SUM 1
#define MPI_MAX 2
#define MPI_MIN 3
#define MPI_UNDEFINED (-32766)

namespace single_process_mpi {
// the bytes of one element; the datatype constants are chosen to need no table
inline size_t element_bytes(MPI_Datatype type) { return type == MPI_FLOAT ? 4 : size_t(type); }
inline void copy(const void* send, void* receive, int count, MPI_Datatype type) {
    if (send != MPI_IN_PLACE && send != receive) std::memmove(receive, send, size_t(count) * element_bytes(type));
}
[[noreturn]] inline void no_peer(const char* call) {
    std::fprintf(stderr, "error: %s: this tpsp was built without MPI (-DTPSP_MPI=OFF) and runs one rank only\n", call);
    std::exit(1);
}
}  // namespace single_process_mpi

// Started by mpirun with several ranks, each copy would train alone: refuse.
inline int MPI_Init(int*, char***) {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
        const char* size = std::getenv(name);
        if (size && std::atoi(size) > 1) single_process_mpi::no_peer("MPI_Init");
    }
    return MPI_SUCCESS;
}
inline int MPI_Finalize() { return MPI_SUCCESS; }
inline int MPI_Initialized(int* flag) {  // nothing to start
    *flag = 1;
    return MPI_SUCCESS;
}
inline int MPI_Get_library_version(char* version, int* length) {
    const char text[] = "none: the one-process stand-in (-DTPSP_MPI=OFF)";
    std::memcpy(version, text, sizeof text);
    *length = int(sizeof text) - 1;
    return MPI_SUCCESS;
}
inline int MPI_Comm_rank(MPI_Comm, int* rank) {
    *rank = 0;
    return MPI_SUCCESS;
}
inline int MPI_Comm_size(MPI_Comm, int* size) {
    *size = 1;
    return MPI_SUCCESS;
}
inline int MPI_Comm_split(MPI_Comm comm, int, int, MPI_Comm* part) {
    *part = comm;
    return MPI_SUCCESS;
}
inline int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* copy) {
    *copy = comm;
    return MPI_SUCCESS;
}
inline int MPI_Comm_free(MPI_Comm* comm) {
    *comm = MPI_COMM_NULL;
    return MPI_SUCCESS;
}

inline int MPI_Allreduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op, MPI_Comm) {
    single_process_mpi::copy(send, receive, count, type);
    return MPI_SUCCESS;
}
inline int MPI_Iallreduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                          MPI_Request* request) {
    *request = MPI_REQUEST_NULL;
    return MPI_Allreduce(send, receive, count, type, op, comm);
}
inline int MPI_Iallgather(const void* send, int count, MPI_Datatype type, void* receive, int, MPI_Datatype, MPI_Comm,
                          MPI_Request* request) {
    *request = MPI_REQUEST_NULL;
    single_process_mpi::copy(send, receive, count, type);
    return MPI_SUCCESS;
}
inline int MPI_Iallgatherv(const void* send, int count, MPI_Datatype type, void* receive, const int*,
                           const int* offsets, MPI_Datatype, MPI_Comm, MPI_Request* request) {
    *request = MPI_REQUEST_NULL;
    char* at = static_cast<char*>(receive) + offsets[0] * single_process_mpi::element_bytes(type);
    single_process_mpi::copy(send, at, count, type);
    return MPI_SUCCESS;
}
inline int MPI_Ialltoall(const void* send, int count, MPI_Datatype type, void* receive, int, MPI_Datatype, MPI_Comm,
                         MPI_Request* request) {
    *request = MPI_REQUEST_NULL;
    single_process_mpi::copy(send, receive, count, type);
    return MPI_SUCCESS;
}
inline int MPI_Ialltoallv(const void* send, const int* counts, const int* offsets, MPI_Datatype type, void* receive,
                          const int*, const int* receive_offsets, MPI_Datatype, MPI_Comm, MPI_Request* request) {
    *request = MPI_REQUEST_NULL;
    const size_t bytes = single_process_mpi::element_bytes(type);
    single_process_mpi::copy(static_cast<const char*>(send) + offsets[0] * bytes,
                             static_cast<char*>(receive) + receive_offsets[0] * bytes, counts[0], type);
    return MPI_SUCCESS;
}
inline int MPI_Igather(const void* send, int count, MPI_Datatype type, void* receive, int, MPI_Datatype, int, MPI_Comm,
                       MPI_Request* request) {
    *request = MPI_REQUEST_NULL;
    single_process_mpi::copy(send, receive, count, type);
    return MPI_SUCCESS;
}
inline int MPI_Igatherv(const void* send, int count, MPI_Datatype type, void* receive, const int*, const int* offsets,
                        MPI_Datatype, int, MPI_Comm, MPI_Request* request) {
    *request = MPI_REQUEST_NULL;
    char* at = static_cast<char*>(receive) + offsets[0] * single_process_mpi::element_bytes(type);
    single_process_mpi::copy(send, at, count, type);
    return MPI_SUCCESS;
}
inline int MPI_Bcast(void*, int, MPI_Datatype, int, MPI_Comm) { return MPI_SUCCESS; }
inline int MPI_Abort(MPI_Comm, int code) { std::exit(code); }
inline int MPI_Isend(const void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request*) {
    single_process_mpi::no_peer("MPI_Isend");
}
inline int MPI_Irecv(void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request*) {
    single_process_mpi::no_peer("MPI_Irecv");
}
inline int MPI_Test(MPI_Request* request, int* done, MPI_Status*) {
    *request = MPI_REQUEST_NULL;
    *done = 1;
    return MPI_SUCCESS;
}
inline int MPI_Wait(MPI_Request* request, MPI_Status*) {
    *request = MPI_REQUEST_NULL;
    return MPI_SUCCESS;
}
