// JobThread: one job at a time, run on its own thread while the submitter goes on; Wait sees the job's writes.
#include "core/job_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace fathom {
namespace {

TEST(JobThreadTest, RunsEachJobOnItsThreadAndWaitSeesItsWrites) {
  std::thread::id started_on;
  JobThread t([&] { started_on = std::this_thread::get_id(); });
  for (int i = 0; i < 200; ++i) {
    int value = 0;
    std::thread::id ran_on;
    t.Submit([&, i] {
      ran_on = std::this_thread::get_id();
      value = i + 1;
    });
    t.Wait();
    EXPECT_EQ(value, i + 1);
    EXPECT_NE(ran_on, std::this_thread::get_id());
    EXPECT_EQ(ran_on, started_on);
  }
  t.Wait();  // nothing pending: returns at once
}

TEST(JobThreadTest, TheSubmitterWorksWhileTheJobRuns) {
  JobThread t;
  std::atomic<bool> release{false};
  std::atomic<bool> done{false};
  t.Submit([&] {
    while (!release.load()) std::this_thread::yield();
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(done.load());  // Submit did not wait for it
  release = true;
  t.Wait();
  EXPECT_TRUE(done.load());
}

TEST(JobThreadTest, TheDestructorFinishesAPendingJob) {
  int value = 0;
  {
    JobThread t;
    t.Submit([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      value = 7;
    });
  }
  EXPECT_EQ(value, 7);
}

TEST(JobThreadDeathTest, SubmittingWhileAJobIsPendingIsAProgrammerError) {
  EXPECT_DEATH(
      {
        JobThread t;
        std::atomic<bool> release{false};
        t.Submit([&] {
          while (!release.load()) std::this_thread::yield();
        });
        t.Submit([] {});
      },
      "a job is already pending");
}

}  // namespace
}  // namespace fathom
